"""The pure parts of PKO v2's Workspace and Update: parsing, what does not apply, config paths, the
Update's conditions, its ttl and its outputs Secret."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import datetime, timedelta, timezone

import pytest

from strata_operator.engine.port import UpdateResult
from strata_operator.services.redaction import redactor_for
from strata_operator.sources.references import RefError
from strata_operator.api.validation import SpecInvalid
from strata_operator.api.auto_conditions import set_conditions
from strata_operator.api.update import aborted, finished, outputs_secret, parse_update, progressing, ttl_remaining
from strata_operator.api.workspace import workspace_ready
from strata_operator.controllers.auto_state import Program, workspace_key, workspace_request
from strata_operator.controllers.update import failure_reason
from strata_operator.api.workspace_values import ConfigItem, ConfigUnavailable, config_values, parse_config_path
from strata_operator.api.workspace import (FluxSource, GitSource, LocalSource, ProjectInfoSource, misplaced_backend,
                                           not_applicable, parse_workspace)
from strata_operator.sources.workspace_program import resolve_env, stack_config

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


REPO, ARTIFACT = "https://git.example/app.git", "http://source-controller.flux-system/a.tar.gz"


def test_sources_parse_and_projectinfo_bypasses_fetching():
    assert parse_workspace({"git": {"url": REPO, "ref": "main", "dir": "d"}}).source == GitSource(REPO, "main", "d")
    assert parse_workspace({"flux": {"url": ARTIFACT, "digest": "sha256:x"}}).source == FluxSource(ARTIFACT, "sha256:x")
    assert parse_workspace({"local": {"dir": "/p"}}).source == LocalSource("/p")
    both = parse_workspace({"git": {"url": REPO, "ref": "r"}, "projectInfo": {"name": "n", "runtime": "yaml"}})
    assert both.source == ProjectInfoSource("n", "yaml")


@pytest.mark.parametrize("spec, words", [
    ({}, "spec: no program source (fix: give one of spec.git, spec.flux or spec.local)"),
    ({"git": {"url": "u", "ref": "r"}, "flux": {"url": "u", "digest": "d"}}, "spec.flux: several program sources"),
    ({"git": {"url": REPO}}, "spec.git.ref: empty (fix: name a branch, tag or commit SHA)"),
    ({"flux": {"url": ARTIFACT}}, "spec.flux.digest: empty"),
    ({"git": {"url": "file:///srv/git/other-team.git", "ref": "main"}},
     "spec.git.url: 'file:///srv/git/other-team.git' is a repository on the operator's own filesystem"),
    ({"git": {"url": "/srv/git/other-team.git", "ref": "main"}}, "spec.git.url: '/srv/git/other-team.git' is a "
                                                                  "repository on the operator's own filesystem"),
    ({"git": {"url": "other-team", "ref": "main"}}, "spec.git.url: not a git URL"),  # git reads ./other-team
    ({"flux": {"url": "file:///var/lib/strata/a.tar.gz", "digest": "sha256:x"}},
     "spec.flux.url: 'file:///var/lib/strata/a.tar.gz' is not an http:// or https:// URL"),
    ({"local": {"dir": "rel"}}, "spec.local.dir: 'rel' is not an absolute path"),
    ({"local": {"dir": "/p"}, "stacks": [{"name": "dev", "config": [{"key": "k", "valueFrom": {"path": "/f"}}]}]},
     "spec.stacks[0].config[0].valueFrom.path: '/f' is a file in PKO's workspace pod"),
])
def test_invalid_specs_name_the_field_and_the_fix(spec, words):
    with pytest.raises(SpecInvalid) as err:
        parse_workspace(spec)
    assert words in str(err.value)


def test_pod_fields_are_kept_for_a_pod_executor_and_named_as_not_applicable():
    raw = {"local": {"dir": "/p"}, "image": "i", "resources": {"requests": {"cpu": 1}}, "securityProfile": "baseline",
           "podTemplate": {"spec": {}}, "env": [{"name": "R", "valueFrom": {"resourceFieldRef": {"resource": "x"}}},
                                                {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]}
    spec = parse_workspace(raw)
    assert spec.pod == {"image": "i", "resources": {"requests": {"cpu": 1}}, "podTemplate": {"spec": {}},
                        "securityProfile": "baseline"}
    assert not_applicable(raw) == ["spec.image", "spec.resources", "spec.podTemplate", "spec.securityProfile",
                                   "spec.env[R].valueFrom.resourceFieldRef"]
    # The schema's default profile is on every Workspace: not reported.
    assert not_applicable({"securityProfile": "restricted", "serviceAccountName": "default"}) == []


def test_env_from_secrets_and_configmaps_in_kubernetes_order():
    secrets = {"s": {"PULUMI_CONFIG_PASSPHRASE": "pass-9d1f", "SHARED": "from-secret"}, "k": {"token": "tok-7a2c"}}
    maps = {"c": {"SHARED": "from-map", "PLAIN": "p"}}

    async def read_secret(ns, name):
        return secrets.get(name)

    async def read_map(ns, name):
        return maps.get(name)

    spec = parse_workspace({"local": {"dir": "/p"}, "serviceAccountName": "sa",
                            "envFrom": [{"secretRef": {"name": "s"}}, {"configMapRef": {"name": "c"}, "prefix": ""},
                                        {"secretRef": {"name": "gone", "optional": True}}],
                            "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "k", "key": "token"}}},
                                    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                                    {"name": "LIT", "value": "v"}]})
    env = asyncio.run(resolve_env(spec, "team", read_secret, read_map))
    assert env.env == {"POD_NAMESPACE": "team", "POD_SA_NAME": "sa", "PULUMI_CONFIG_PASSPHRASE": "pass-9d1f",
                       "SHARED": "from-map", "PLAIN": "p", "TOKEN": "tok-7a2c", "NS": "team", "LIT": "v"}
    assert env.secret_env == {"PULUMI_CONFIG_PASSPHRASE", "TOKEN"}
    assert redactor_for("team").redact("tok-7a2c pass-9d1f") == "[secret] [secret]"
    missing = parse_workspace({"local": {"dir": "/p"}, "env": [
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "k", "key": "nope"}}}]})
    with pytest.raises(RefError, match=r"spec.env\[X\].valueFrom.secretKeyRef: Secret 'k' has no key 'nope'"):
        asyncio.run(resolve_env(missing, "team", read_secret, read_map))


def test_stack_config_paths_env_and_secrets():
    assert parse_config_path('data.nums[1]') == ["data", "nums", 1]
    assert parse_config_path('aws:tags["a.b"]') == ["aws:tags", "a.b"]
    spec = parse_workspace({"local": {"dir": "/p"}, "stacks": [{"name": "dev", "config": [
        {"key": "kubernetes:namespace", "value": "default"},
        {"key": "data.active", "path": True, "value": "true"},
        {"key": "data.nums[0]", "path": True, "value": "1"}, {"key": "data.nums[1]", "path": True, "value": "2"},
        {"key": "obj", "value": {"a": [1, 2]}},
        {"key": "fromEnv", "valueFrom": {"env": "J", "json": True}},
        {"key": "pw", "secret": True, "valueFrom": {"env": "PW"}}]}]})
    config, secret = stack_config(spec.stack("dev"), {"J": '{"x": 1}', "PW": "pw-31c4"}, "team")
    assert config == {"kubernetes:namespace": "default", "data": {"active": True, "nums": [1, 2]},
                      "obj": {"a": [1, 2]}, "fromEnv": {"x": 1}}
    assert secret == {"pw": "pw-31c4"}
    assert redactor_for("team").redact("pw-31c4") == "[secret]"
    with pytest.raises(RefError, match="missing value for environment variable: PW"):
        stack_config(spec.stack("dev"), {"J": "{}"}, "team")


def test_a_backend_on_a_pod_volume_is_named():
    raw = {"podTemplate": {"spec": {"containers": [{"name": "pulumi", "volumeMounts": [{"name": "state",
                                                                                        "mountPath": "/state"}]}]}}}
    issue = misplaced_backend(raw, {"PULUMI_BACKEND_URL": "file:///state/"}, in_workspace_pods=False)
    assert issue is not None and "inside the volume 'state'" in str(issue)
    assert misplaced_backend(raw, {"PULUMI_BACKEND_URL": "file:///srv/state"}, in_workspace_pods=False) is None
    # The pod executor has the volume; state anywhere else in the pod would go with it.
    assert misplaced_backend(raw, {"PULUMI_BACKEND_URL": "file:///state/"}, in_workspace_pods=True) is None
    issue = misplaced_backend(raw, {"PULUMI_BACKEND_URL": "file:///srv/state"}, in_workspace_pods=True)
    assert issue is not None and issue.path == "spec.env[PULUMI_BACKEND_URL]" and "lost with the pod" in str(issue)


def test_under_the_pod_executor_only_the_service_and_log_level_do_not_apply():
    raw = {"image": "team/pulumi:1", "imagePullPolicy": "Always", "resources": {"limits": {"memory": "1Gi"}},
           "podTemplate": {"spec": {"nodeSelector": {"a": "b"}}}, "serviceTemplate": {"metadata": {"labels": {}}},
           "pulumiLogLevel": 3, "securityProfile": "baseline",
           "env": [{"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]}
    assert not_applicable(raw, in_workspace_pods=True) == ["spec.serviceTemplate", "spec.pulumiLogLevel",
                                                           "spec.securityProfile"]
    assert "spec.image" in not_applicable(raw) and "spec.env[CPU].valueFrom.resourceFieldRef" in not_applicable(raw)


def test_update_spec_and_its_invalid_fields():
    spec = parse_update({"workspaceName": "ws", "stackName": "dev", "type": "up", "ttlAfterCompleted": "1m30s",
                         "target": ["urn:a"], "continueOnError": True})
    assert (spec.ttl_seconds, spec.target, spec.continue_on_error) == (90.0, ("urn:a",), True)
    with pytest.raises(SpecInvalid) as err:
        parse_update({"type": "deploy", "ttlAfterCompleted": "soon"})
    assert err.value.fields == ["spec.type", "spec.workspaceName", "spec.stackName", "spec.ttlAfterCompleted"]


def test_conditions_as_pko_writes_them():
    started = set_conditions(None, progressing(), 1, NOW)
    assert [(c["type"], c["status"], c["reason"]) for c in started] == [
        ("Progressing", "True", "Progressing"), ("Failed", "False", "Progressing"), ("Complete", "False", "Progressing")]
    later = NOW + timedelta(seconds=9)
    done = set_conditions(started, finished(None), 1, later)
    assert [(c["type"], c["status"], c["reason"]) for c in done] == [
        ("Progressing", "False", "Complete"), ("Failed", "False", "UpdateSucceeded"), ("Complete", "True", "Updated")]
    # lastTransitionTime moves only when the status flips (Failed stayed False).
    assert done[1]["lastTransitionTime"] == started[1]["lastTransitionTime"] != done[2]["lastTransitionTime"]
    assert [c["reason"] for c in set_conditions(None, aborted("Aborted"), 1, NOW)] == ["Failed", "Aborted", "Failed"]
    assert failure_reason(UpdateResult("conflict")) == "UpdateConflict"
    assert failure_reason(UpdateResult("failed", "boom")) == "Unknown"


def test_ttl_counts_from_completion():
    status = {"conditions": set_conditions(None, finished(None), 1, NOW)}
    assert ttl_remaining(status, 60, NOW + timedelta(seconds=20)) == 40
    assert ttl_remaining(status, None, NOW) is None
    assert ttl_remaining({"conditions": set_conditions(None, progressing(), 1, NOW)}, 60, NOW) is None


def test_outputs_secret_as_pko_writes_it():
    secret, missing = outputs_secret("ns", "up-1", "uid-1", {"plain": ("a<b", False), "with space": (None, True),
                                                             "gone": (None, True)},
                                     {"plain": "a<b", "with space": {"k": 1}})
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {"plain": '"a\\u003cb"', "with_space": '{"k":1}'} and missing == ["gone"]
    assert secret["immutable"] is True and secret["metadata"]["name"] == "up-1-stack-outputs"
    assert json.loads(secret["metadata"]["annotations"]["pulumi.com/secrets"]) == ["with_space"]
    assert secret["metadata"]["ownerReferences"] == [{"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update",
                                                      "name": "up-1", "uid": "uid-1"}]


def test_workspace_readiness_and_engine_key():
    ws = {"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "conditions": [
        {"type": "Ready", "status": "True"}]}}
    assert workspace_ready(ws)
    assert not workspace_ready({**ws, "status": {**ws["status"], "observedGeneration": 1}})
    assert workspace_key("ns", "ws") == "ns/ws@workspace"


def test_under_the_pod_executor_a_workspaces_pod_reads_its_own_environment_and_config():
    """The operator hands the pod the Workspace's spec and leaves every value to it: no env, no config
    values, only the items to resolve there and the names whose values it must mask."""
    raw = {"serviceAccountName": "deployer", "image": "team/pulumi:3", "local": {"dir": "/program"},
           "env": [{"name": "PULUMI_BACKEND_URL", "value": "file:///state"},
                   {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}],
           "stacks": [{"name": "dev", "secretsProvider": "passphrase",
                       "config": [{"key": "greeting", "valueFrom": {"env": "GREETING"}},
                                  {"key": "size", "value": "3"}]}]}
    spec = parse_workspace(raw)
    request = workspace_request("team", "ws", raw, spec, Program(local_dir="/program"), stack_name="dev", refresh=True)
    assert (request.stack_key, request.stack_name, request.local_dir) == ("team/ws@workspace", "dev", "/program")
    assert request.workspace_template == {"spec": raw} and request.service_account == "deployer"
    assert request.env == {} and request.config == {} and request.refresh
    assert [ConfigItem.from_json(i).key for i in request.env_config] == ["greeting", "size"]
    assert request.secrets_provider == "passphrase"
    assert request.secret_env == ("PULUMI_ACCESS_TOKEN", "PULUMI_CONFIG_PASSPHRASE", "TOKEN")
    # What the agent makes of the items, from the pod's environment.
    config, secrets = config_values(map(ConfigItem.from_json, request.env_config), {"GREETING": "hi"})
    assert (config, secrets) == ({"greeting": "hi", "size": "3"}, {})
    with pytest.raises(ConfigUnavailable, match=r"spec.stacks\[0\].config\[0\].valueFrom.env: missing value"):
        config_values(map(ConfigItem.from_json, request.env_config), {})
