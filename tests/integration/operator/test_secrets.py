"""A canary secret (from Secrets via secretsRef, envRefs and gitAuth) never reaches logs, Events or status;
nor does one on a failure path (a program printing its environment, an engine error carrying secret
config, a Flux artifact URL with credentials that cannot be fetched), looked for in the operator log,
the worker logs, Events, status and every file of the operator's state directory."""

import base64
import json
from datetime import datetime, timezone

from strata_operator.engine.process.executor import UPDATE_LOG

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


# --- Canaries where failures happen ---------------------------------------------------------------

CANARY_DUMPED_ENV = "canary-dumped-env-e3b1c0-do-not-leak"
CANARY_FAILING_CONFIG = "canary-failing-config-5f20aa-do-not-leak"
CANARY_ARTIFACT_PASSWORD = "canary-artifact-password-a7c4d9-do-not-leak"

# A program that fails printing its whole environment (the language host's, which is the update's):
# fn::readFile of a path made of the environment fails naming that path. The canary variable is put
# first so that it is also in the part of the message that status keeps.
ENV_DUMP = {
    "variables": {
        "environ": {"fn::join": [" ", {"fn::split": ["\0", {"fn::readFile": "/proc/self/environ"}]}]},
        "canary": {"fn::select": [0, {"fn::split": [" ", {"fn::select": [1, {"fn::split": [
            "STRATA_CANARY_ENV=", "${environ}"]}]}]}]},
    },
    "outputs": {"never": {"fn::readFile": "/nonexistent/${canary} ${environ}"}},
}
# An engine error carrying a secret config value (the engine, too, is meant to mask it). Not fn::readFile
# of a secret path: the YAML host (v1.38.1) reports that error yet the update exits 0.
CONFIG_ERROR = {"configuration": {"token": {"type": "String"}},
                "outputs": {"never": {"fn::fromBase64": "${token}"}}}
FLUX = ("source.toolkit.fluxcd.io", "v1")


def _failed(obj: dict) -> bool:
    return ((obj.get("status") or {}).get("lastUpdate") or {}).get("state") == "failed"


def _state_files(state_dir) -> dict[str, bytes]:
    """Every regular file the operator keeps (workdirs, PULUMI_HOMEs, worker logs, records), whole."""
    return {str(path): path.read_bytes() for path in state_dir.rglob("*") if path.is_file() and not path.is_symlink()}


def test_canaries_on_failure_paths_reach_no_log_event_status_or_state_file(stacks, operator):
    stacks.secret("failing", {"env": CANARY_DUMPED_ENV, "config": CANARY_FAILING_CONFIG})
    env_ref = {"STRATA_CANARY_ENV": {"type": "Secret", "secret": {"name": "failing", "key": "env"}}}
    config_ref = {"token": {"type": "Secret", "secret": {"name": "failing", "key": "config"}}}

    stacks.program("env-dump", ENV_DUMP)
    stacks.create("env-dump", stacks.spec(stack="env-dump", programRef={"name": "env-dump"},
                                          envRefs={**stacks.spec()["envRefs"], **env_ref}))
    stacks.program("config-error", CONFIG_ERROR)
    stacks.create("config-error", stacks.spec(stack="config-error", programRef={"name": "config-error"},
                                              secretsRef=config_ref))
    # A Flux artifact URL carrying credentials that cannot be fetched (urllib refuses the userinfo and
    # quotes it, outside the URL, in its error). The GitRepository is suspended so that its status says
    # exactly this; the Stack carries the other canaries too.
    stacks.custom.create_namespaced_custom_object(*FLUX, stacks.namespace, "gitrepositories", {
        "apiVersion": "/".join(FLUX), "kind": "GitRepository", "metadata": {"name": "fetch-fails"},
        "spec": {"url": "http://127.0.0.1:9/none.git", "interval": "1h", "suspend": True}})
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    stacks.custom.patch_namespaced_custom_object_status(*FLUX, stacks.namespace, "gitrepositories", "fetch-fails", {
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded", "message": "stored",
                                   "lastTransitionTime": now, "observedGeneration": 1}],
                   "artifact": {"url": f"http://flux:{CANARY_ARTIFACT_PASSWORD}@127.0.0.1/artifact.tar.gz",
                                "digest": "sha256:" + "0" * 64, "revision": "main@sha1:" + "c" * 40,
                                "path": "gitrepository/x/fetch-fails/artifact.tar.gz", "lastUpdateTime": now}}})
    stacks.create("fetch-fails", stacks.spec(
        stack="fetch-fails", fluxSource={"sourceRef": {"apiVersion": "/".join(FLUX), "kind": "GitRepository",
                                                       "name": "fetch-fails"}},
        envRefs={**stacks.spec()["envRefs"], **env_ref}, secretsRef=config_ref))

    # Each failure happened, and with the secret where it would have been.
    dumped = stacks.wait("env-dump", _failed, 90, "the environment-printing update failed")
    assert "Error reading file at path /nonexistent/[secret] " in dumped["status"]["lastUpdate"]["message"]
    assert "PULUMI_CONFIG_PASSPHRASE=[secret]" in dumped["status"]["lastUpdate"]["message"]
    config_error = stacks.wait("config-error", _failed, 90, "the update carrying secret config failed")
    assert "illegal base64 data at input byte" in config_error["status"]["lastUpdate"]["message"]
    fetch = stacks.wait_stalled("fetch-fails", "SourceUnavailable", 60)
    stalled = next(c for c in fetch["status"]["conditions"] if c["type"] == "Stalled")
    assert "artifact download from http://[secret]@127.0.0.1/artifact.tar.gz failed" in stalled["message"], stalled
    assert stacks.runs("fetch-fails") == 0

    worker_logs = {name: operator.state_dir / "stacks" / stacks.namespace / name / UPDATE_LOG
                   for name in ("env-dump", "config-error")}
    for name, says in (("env-dump", "STRATA_CANARY_ENV=[secret]"), ("config-error", "fn::fromBase64 unable to decode [secret]")):
        record = json.loads(worker_logs[name].read_text())
        assert record["outcome"] == "failed" and says in record["output"], (name, record)

    everything = {
        "status": json.dumps([stacks.get(name) for name in ("env-dump", "config-error", "fetch-fails")]).encode(),
        "events": json.dumps([e.to_dict() for e in stacks.core.list_namespaced_event(stacks.namespace).items],
                             default=str).encode(),
        "operator log": operator.log_text().encode(),
        **{f"worker log {name}": path.read_bytes() for name, path in worker_logs.items()},
        **{f"state file {path}": data for path, data in _state_files(operator.state_dir).items()},
    }
    for secret in (CANARY_DUMPED_ENV, CANARY_FAILING_CONFIG, CANARY_ARTIFACT_PASSWORD, PASSPHRASE):
        forms = (secret.encode(), base64.b64encode(secret.encode()))
        for where, data in everything.items():
            assert not any(form in data for form in forms), f"{secret} leaked into the {where}"
