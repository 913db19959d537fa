"""How the handler writes spec.outputsSecret: created when absent, replaced (with its resourceVersion) only
when it differs, never when another owner's, and API failures reported without any value. The apiserver is
replaced by an in-memory recorder of Secret calls."""

import asyncio
import base64

from kubernetes.client.rest import ApiException

from strata_operator.engine.port import UpdateResult
from strata_operator.controllers.context import Context, OperatorSettings
from strata_operator.controllers.stack_session import StackSession
from strata_operator.controllers.stack_update import outputs_secret_problem, _write_outputs_secret

REAL = {"url": "http://x", "password": "hunter2-unit"}


class SecretsKube:
    def __init__(self, existing=None, fail=None):
        self.secrets = {} if existing is None else {existing["metadata"]["name"]: existing}
        self.calls, self.fail = [], fail

    async def get_secret(self, namespace, name):
        if self.fail == "get":
            raise ApiException(status=403, reason="Forbidden")
        return self.secrets.get(name)

    async def create_secret(self, namespace, body):
        self.calls.append(("create", body))
        if self.fail == "write":
            raise ApiException(status=422, reason=f"Unprocessable {REAL['password']}")
        self.secrets[body["metadata"]["name"]] = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}

    async def replace_secret(self, namespace, name, body):
        self.calls.append(("replace", body))
        self.secrets[name] = body


def session(kube):
    ctx = Context(kube=kube, engine=None, settings=OperatorSettings())
    body = {"metadata": {"namespace": "ns", "name": "app", "uid": "uid-1", "generation": 1}, "status": {}}
    return StackSession(ctx, body, logger=None)


def result(real=REAL):
    return UpdateResult("succeeded", outputs={"url": ("http://x", False), "password": (None, True)},
                        real_outputs=real, outputs_error="" if real else "reading the outputs' values failed: boom")


def test_created_when_absent_then_left_alone_until_a_value_changes():
    kube = SecretsKube()
    assert asyncio.run(_write_outputs_secret(session(kube), "out", result())) is None
    [(verb, body)] = kube.calls
    assert verb == "create" and body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert base64.b64decode(body["data"]["password"]).decode() == "hunter2-unit"
    assert asyncio.run(_write_outputs_secret(session(kube), "out", result())) is None
    assert len(kube.calls) == 1, "the same outputs write nothing"
    assert asyncio.run(_write_outputs_secret(session(kube), "out", result({**REAL, "password": "rotated!"}))) is None
    verb, body = kube.calls[-1]
    assert verb == "replace" and body["metadata"]["resourceVersion"] == "1"


def test_another_owners_secret_is_never_written():
    foreign = {"metadata": {"name": "out", "ownerReferences": [{"kind": "Stack", "name": "x", "uid": "other"}]}}
    kube = SecretsKube(foreign)
    problem = asyncio.run(_write_outputs_secret(session(kube), "out", result()))
    assert problem.startswith("spec.outputsSecret.name: Secret 'out' already exists and is owned by Stack/x")
    assert kube.calls == []
    assert asyncio.run(outputs_secret_problem(session(kube), "out")) == problem
    assert asyncio.run(outputs_secret_problem(session(SecretsKube()), "out")) is None


def test_failures_name_the_field_and_never_a_value():
    problem = asyncio.run(_write_outputs_secret(session(SecretsKube(fail="write")), "out", result()))
    assert problem.startswith("spec.outputsSecret.name: create Secret 'out' failed: HTTP 422")
    denied = asyncio.run(outputs_secret_problem(session(SecretsKube(fail="get")), "out"))
    assert "may not read Secret 'out' (HTTP 403): grant it get, create and update on secrets" in denied
    unread = asyncio.run(_write_outputs_secret(session(SecretsKube()), "out", result(None)))
    assert unread == "spec.outputsSecret: the update succeeded but reading the outputs' values failed: boom"
    for text in (problem, denied, unread):
        assert "hunter2-unit" not in text
