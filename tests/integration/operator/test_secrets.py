"""A canary secret (from Secrets via secretsRef, envRefs and gitAuth) never reaches logs, Events or status."""

import base64
import json

from .conftest import PASSPHRASE, stash_project

CANARY = "canary-7c1e5b2f-do-not-leak"
CANARY_ENV = "canary-env-90ab12-do-not-leak"
CANARY_TOKEN = "canary-git-4d4d17-do-not-leak"


def _secret_program(extra_required: bool) -> dict:
    configuration = {"token": {"type": "String"}}
    if extra_required:
        configuration["region"] = {"type": "String"}  # never set: the update fails
    return {"configuration": configuration,
            "resources": {"vault": {"type": "pulumi:index:Stash", "properties": {"input": "${token}"}},
                          "plain": {"type": "pulumi:index:Stash", "properties": {"input": "visible"}}},
            "outputs": {"vault": "${vault.input}", "plain": "${plain.input}"}}


def test_canary_secret_never_leaks(stacks, local_platform, operator):
    stacks.secret("canary", {"token": CANARY, "env": CANARY_ENV, "git": CANARY_TOKEN})
    refs = {"secretsRef": {"token": {"type": "Secret", "secret": {"name": "canary", "key": "token"}}},
            "envRefs": {**stacks.spec()["envRefs"],
                        "CANARY_ENV": {"type": "Secret", "secret": {"name": "canary", "key": "env"}}}}
    stacks.program("ok", _secret_program(extra_required=False))
    stacks.program("broken", _secret_program(extra_required=True))
    stacks.create("ok", stacks.spec(programRef={"name": "ok"}, **refs))
    stacks.create("broken", stacks.spec(stack="broken", programRef={"name": "broken"}, **refs))
    url = local_platform.git.create(f"{stacks.namespace}-tokened", {"Pulumi.yaml": stash_project("tokened", n="1")})
    stacks.create("tokened", stacks.spec(stack="tokened", projectRepo=url, branch="main",
                                         gitAuth={"accessToken": {"type": "Secret",
                                                                  "secret": {"name": "canary", "key": "git"}}}))

    ok = stacks.wait_ready("ok", 90)
    assert ok["status"]["outputs"] == {"plain": "visible", "vault": "[secret]"}
    broken = stacks.wait("broken", lambda o: (o["status"].get("lastUpdate") or {}).get("state") == "failed", 90,
                         "the failed update recorded")
    assert "region" in broken["status"]["lastUpdate"]["message"]
    stacks.wait_ready("tokened", 90)

    everything = {
        "status": json.dumps([stacks.get(name) for name in ("ok", "broken", "tokened")]),
        "events": json.dumps([e.to_dict() for e in stacks.core.list_namespaced_event(stacks.namespace).items],
                             default=str),
        "operator log": operator.log_text(),
    }
    for secret in (CANARY, CANARY_ENV, CANARY_TOKEN, PASSPHRASE):
        encoded = base64.b64encode(secret.encode()).decode()
        for where, text in everything.items():
            assert secret not in text and encoded not in text, f"{secret} leaked into the {where}"


def test_plain_values_stay_readable_where_secret_ones_are_masked(stacks, operator, tmp_path):
    """The same failure (a backend directory that cannot be created) with the backend URL given as a
    Literal and from a Secret: the literal path is shown, the secret one is masked everywhere."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    literal_dir, secret_dir = blocker / "literal-path-visible", blocker / "secret-path-canary-31d7"
    stacks.secret("backend", {"url": secret_dir.as_uri()})
    stacks.program("plain", {"resources": {"n": {"type": "pulumi:index:Stash", "properties": {"input": "x"}}}})
    passphrase = stacks.spec()["envRefs"]
    for name, ref in (("literal", {"type": "Literal", "literal": {"value": literal_dir.as_uri()}}),
                      ("hidden", {"type": "Secret", "secret": {"name": "backend", "key": "url"}})):
        spec = stacks.spec(stack=name, programRef={"name": "plain"},
                           envRefs={**passphrase, "PULUMI_BACKEND_URL": ref})
        del spec["backend"]  # spec.backend would override the envRef
        stacks.create(name, spec)

    shown = stacks.wait_stalled("literal", "UpdateFailed", 90)
    assert f"cannot create the file:// backend's directory {literal_dir}: Not a directory" in json.dumps(shown)
    hidden = stacks.wait_stalled("hidden", "UpdateFailed", 90)
    assert "cannot create the file:// backend's directory [secret]: Not a directory" in json.dumps(hidden)
    everything = {
        "status": json.dumps(hidden),
        "events": json.dumps([e.to_dict() for e in stacks.events("hidden")], default=str),
        "operator log": operator.log_text(),
    }
    for where, text in everything.items():
        assert "secret-path-canary-31d7" not in text, f"the secret backend path leaked into the {where}"
