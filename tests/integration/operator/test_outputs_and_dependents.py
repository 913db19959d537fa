"""spec.outputsSecret and output-driven dependents on the real operator and engine.

A Stack's outputs land, with their real values (secret ones included), in a Secret it owns, while
status, Events and the operator's log only ever show `[secret]`; a Secret the Stack does not own is
never touched. A dependent re-runs when what it consumes of a prerequisite's outputs changed, and
not when the prerequisite merely ran again."""

import base64
import json
import uuid

import pytest
from kubernetes import client

from strata_components.local import processes

from .conftest import condition, eventually_constant, has_condition, stash_program


def secret_program(password: str) -> dict:
    """Plain outputs and one secret output (fn::secret: the engine keeps it encrypted, status masks it)."""
    return {"resources": {"pw": {"type": "pulumi:index:Stash", "properties": {"input": {"fn::secret": password}}}},
            "outputs": {"url": "http://db.example:5432", "port": 5432, "password": "${pw.input}"}}


def read_secret(stacks, name: str) -> client.V1Secret | None:
    try:
        return stacks.core.read_namespaced_secret(name, stacks.namespace)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def decoded(secret: client.V1Secret) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def assert_never_shown(stacks, operator, value: str) -> None:
    """The real value is nowhere users read: no Stack's status, no Event in the namespace, no operator log."""
    for stack in stacks.custom.list_namespaced_custom_object("pulumi.com", "v1", stacks.namespace, "stacks")["items"]:
        assert value not in json.dumps(stack.get("status") or {}), f"in {stack['metadata']['name']}'s status"
    for event in stacks.core.list_namespaced_event(stacks.namespace).items:
        assert value not in (event.message or ""), f"in Event {event.reason}"
    assert value not in operator.log_text(), "in the operator's log"


def test_outputs_reach_an_owned_secret_with_real_values_and_nowhere_else(stacks, operator):
    password = f"pw-{uuid.uuid4().hex}"
    stacks.program("db", secret_program(password))

    # A Secret the Stack does not own is never overwritten: nothing runs, the status names the field and the fix.
    stacks.secret("db-outputs", {"owner": "someone else"})
    stacks.create("db", stacks.spec(stack="db", programRef={"name": "db"}, outputsSecret={"name": "db-outputs"}))
    stalled = stacks.wait_stalled("db", "OutputsSecretUnwritable", 60)
    message = condition(stalled, "Stalled")["message"]
    assert message.startswith("spec.outputsSecret.name: Secret 'db-outputs' already exists and has no owner")
    assert "Name another Secret in spec.outputsSecret.name, or delete 'db-outputs'" in message
    assert stacks.runs("db") == 0
    assert decoded(read_secret(stacks, "db-outputs")) == {"owner": "someone else"}
    assert stacks.wait_events("db", "StackOutputRetrievalFailure")

    # Deleted: the Stack notices on its own (checked every 30 s), runs, and creates its Secret.
    stacks.core.delete_namespaced_secret("db-outputs", stacks.namespace)
    ready = stacks.wait_ready("db", 120)
    assert stacks.runs("db") == 1
    secret = read_secret(stacks, "db-outputs")
    assert decoded(secret) == {"url": "http://db.example:5432", "port": "5432", "password": password}
    assert secret.type == "Opaque"
    assert secret.metadata.labels == {"app.kubernetes.io/managed-by": "strata-operator", "pulumi.com/stack-name": "db"}
    (owner,) = secret.metadata.owner_references
    assert (owner.api_version, owner.kind, owner.name, owner.uid, owner.controller) == (
        "pulumi.com/v1", "Stack", "db", ready["metadata"]["uid"], True)
    status = ready["status"]
    assert status["outputs"] == {"url": "http://db.example:5432", "port": 5432, "password": "[secret]"}
    assert status["outputDigests"]["password"].startswith("hmac-sha256:")
    assert status["outputDigests"]["url"].startswith("sha256:") and status["outputsDigest"].startswith("sha256:")

    # A new secret value: the Secret follows after the update; nothing shows either value.
    rotated = f"pw-{uuid.uuid4().hex}"
    stacks.replace_program("db", secret_program(rotated))
    processes.wait_until(lambda: decoded(read_secret(stacks, "db-outputs")).get("password") == rotated, 90,
                         "the Secret to hold the rotated password")
    after = stacks.wait_ready("db", 30)
    assert after["status"]["outputDigests"]["password"] != status["outputDigests"]["password"]
    assert after["status"]["outputDigests"]["url"] == status["outputDigests"]["url"]
    assert stacks.runs("db") == 2
    version = read_secret(stacks, "db-outputs").metadata.resource_version
    # A run with the same outputs writes nothing.
    stacks.patch("db", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "same-outputs"}}})
    stacks.wait("db", lambda o: (o["status"].get("lastUpdate") or {}).get("reconcileRequest") == "same-outputs"
                and has_condition(o, "Ready"), 90, "the reconcile request answered")
    assert read_secret(stacks, "db-outputs").metadata.resource_version == version
    for value in (password, rotated):
        assert_never_shown(stacks, operator, value)

    # Owned by the Stack: the garbage collector deletes it with the Stack.
    stacks.delete("db")
    processes.wait_until(lambda: read_secret(stacks, "db-outputs") is None, 60, "the outputs Secret to go with its Stack")


def test_an_invalid_outputs_secret_name_is_refused_naming_the_field(stacks):
    stacks.program("bad", stash_program(v="x"))
    with pytest.raises(client.ApiException) as raised:
        stacks.create("bad", stacks.spec(programRef={"name": "bad"}, outputsSecret={"name": "Not_A_Secret"}))
    assert raised.value.status == 422 and "spec.outputsSecret.name" in raised.value.body
    with pytest.raises(client.ApiException) as raised:
        stacks.create("bad", stacks.spec(programRef={"name": "bad"}, prerequisites=[{"name": "a", "outputs": []}]))
    assert raised.value.status == 422 and "spec.prerequisites[0].outputs" in raised.value.body


def base_program() -> dict:
    return {"configuration": {"url": {"type": "String"}, "tag": {"type": "String"}, "token": {"type": "String"}},
            "outputs": {"url": "${url}", "tag": "${tag}", "token": {"fn::secret": "${token}"}}}


def last_run(stacks, name: str) -> str:
    return ((stacks.get(name) or {}).get("status", {}).get("lastUpdate") or {}).get("name", "")


def test_dependents_rerun_only_when_what_they_consume_changed(stacks, operator):
    stacks.program("base", base_program())
    stacks.program("consumer", stash_program(role="consumer"))
    # The dependents first: they wait for base, and base's update knows it has dependents (its secret
    # output's value is read, so its digest covers it).
    stacks.create("all", stacks.spec(stack="all", programRef={"name": "consumer"}, prerequisites=[{"name": "base"}]))
    stacks.create("url-only", stacks.spec(stack="url-only", programRef={"name": "consumer"},
                                          prerequisites=[{"name": "base", "outputs": ["url"]}]))
    stacks.wait("all", lambda o: has_condition(o, "Reconciling", "PrerequisiteNotSatisfied"), 60, "waiting for base")
    token = f"tok-{uuid.uuid4().hex}"
    stacks.create("base", stacks.spec(stack="base", programRef={"name": "base"},
                                      config={"url": "https://v1.example", "tag": "one", "token": token}))
    base = stacks.wait_ready("base", 90)
    stacks.wait_ready("all", 90)
    stacks.wait_ready("url-only", 90)
    digest = base["status"]["outputsDigest"]
    assert stacks.get("all")["status"]["lastUpdate"]["prerequisiteDigests"] == {"base": digest}
    assert set(stacks.get("url-only")["status"]["lastUpdate"]["prerequisiteDigests"]) == {"base"}
    runs = lambda: (stacks.runs("base"), stacks.runs("all"), stacks.runs("url-only"))  # noqa: E731
    assert runs() == (1, 1, 1)

    # base runs again with the same outputs: no dependent runs.
    stacks.patch("base", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "again"}}})
    stacks.wait("base", lambda o: (o["status"].get("lastUpdate") or {}).get("reconcileRequest") == "again"
                and has_condition(o, "Ready"), 90, "base ran again")
    assert stacks.get("base")["status"]["outputsDigest"] == digest
    assert eventually_constant(runs, 8) == (2, 1, 1), "an unchanged prerequisite run re-ran a dependent"

    # An output only `all` consumes changes: `all` re-runs once, `url-only` does not.
    before = last_run(stacks, "all")
    stacks.patch("base", {"spec": {"config": {"tag": "two"}}})
    processes.wait_until(lambda: last_run(stacks, "all") != before and has_condition(stacks.get("all"), "Ready"),
                         90, "all re-ran after base's tag changed")
    assert eventually_constant(runs, 8) == (3, 2, 1)
    (detected,) = [e for e in stacks.events("all", "StackUpdateDetected") if "prerequisite" in e.message]
    assert detected.message == "Outputs of prerequisite 'base' changed since the last update"
    assert stacks.get("all")["status"]["lastUpdate"]["prerequisiteDigests"] == {
        "base": stacks.get("base")["status"]["outputsDigest"]}

    # The secret output changes: its keyed digest changes, so `all` re-runs; the value shows nowhere.
    before = last_run(stacks, "all")
    rotated = f"tok-{uuid.uuid4().hex}"
    stacks.patch("base", {"spec": {"config": {"token": rotated}}})
    processes.wait_until(lambda: last_run(stacks, "all") != before and has_condition(stacks.get("all"), "Ready"),
                         90, "all re-ran after base's secret output changed")
    assert eventually_constant(runs, 8) == (4, 3, 1)
    assert stacks.get("base")["status"]["outputs"]["token"] == "[secret]"
    for value in (token, rotated):
        assert value not in json.dumps(stacks.get("base")["status"])
        assert not [e for e in stacks.core.list_namespaced_event(stacks.namespace).items if value in (e.message or "")]

    # The consumed output changes: both re-run.
    before = last_run(stacks, "url-only")
    stacks.patch("base", {"spec": {"config": {"url": "https://v2.example"}}})
    processes.wait_until(lambda: last_run(stacks, "url-only") != before
                         and has_condition(stacks.get("url-only"), "Ready"), 90, "url-only re-ran after url changed")
    assert eventually_constant(runs, 8) == (5, 4, 2)

    # Naming an output the prerequisite does not have waits, saying which and where.
    stacks.create("typo", stacks.spec(stack="typo", programRef={"name": "consumer"},
                                      prerequisites=[{"name": "base", "outputs": ["endpoint"]}]))
    waiting = stacks.wait("typo", lambda o: has_condition(o, "Reconciling", "PrerequisiteNotSatisfied"), 60,
                          "the missing output named")
    assert condition(waiting, "Reconciling")["message"].startswith("prerequisite 'base' has no output 'endpoint'")
    assert stacks.runs("typo") == 0
