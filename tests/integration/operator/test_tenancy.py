"""Teams own their GitOps, and a team can reach nothing of another's: tried as an attacker would, with
commits under team alpha's directory, against the real (locked-down) Flux controllers and the real
operator. Each team's sync is the Kustomization the platform layer renders (TeamEnvironment's
`build_team_sync`), applied as the team's ServiceAccount (`build_team_objects`)."""

from __future__ import annotations

import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from strata_components import s3
from strata_components.local import processes
from strata_components.team import build_team_source, build_team_sync
from strata_components.team_state import TeamStateCredentialsProvider
from strata_operator.api import FILE_BACKEND_ANNOTATION

from .conftest import (GROUP, PASSPHRASE, VERSION, Stacks, condition, has_condition, stash_program, team_identity,
                       unique)

KUSTOMIZE = ("kustomize.toolkit.fluxcd.io", "v1", "kustomizations")
FLUX_SOURCE = ("source.toolkit.fluxcd.io", "v1", "gitrepositories")


def push(url: str, files: dict[str, str | None], message: str) -> str:
    """Clone, write (None: delete) and push, as a team member would; returns the pushed commit."""
    git = ["git", "-c", "user.name=alpha", "-c", "user.email=alpha@localhost"]
    with tempfile.TemporaryDirectory() as scratch:
        clone = Path(scratch) / "clone"
        subprocess.run([*git, "clone", "-q", url, str(clone)], check=True)
        for path, text in files.items():
            target = clone / path
            if text is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        subprocess.run([*git, "add", "-A"], cwd=clone, check=True)
        subprocess.run([*git, "commit", "-qm", message], cwd=clone, check=True)
        subprocess.run([*git, "push", "-q", "origin", "main"], cwd=clone, check=True)
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, check=True, capture_output=True,
                              text=True).stdout.strip()


def listing(*names: str) -> str:
    return yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                           "resources": list(names)})


def stack(namespace: str, name: str, backend: str, **spec: Any) -> str:
    return yaml.safe_dump({"apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack",
                           "metadata": {"name": name, "namespace": namespace},
                           "spec": {"stack": name, "backend": backend, "destroyOnFinalize": True,
                                    "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {
                                        "type": "Secret", "secret": {"name": "pulumi", "key": "passphrase"}}},
                                    **spec}})


def app(namespace: str, backend: str, greeting: str, **spec: Any) -> dict[str, str]:
    """Alpha's legitimate app: a Program and its Stack (`spec` added to its spec), in alpha's directory."""
    program = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Program",
               "metadata": {"name": "app", "namespace": namespace,
                            "annotations": {"kustomize.toolkit.fluxcd.io/substitute": "disabled"}},
               "program": stash_program(greeting=greeting)}
    return {"teams/alpha/program.yaml": yaml.safe_dump(program),
            "teams/alpha/app.yaml": stack(namespace, "app", backend, programRef={"name": "app"}, **spec)}


class Team:
    """One team's namespace, identity and sync, as the platform layer makes them."""

    def __init__(self, kube_client, platform, operator, namespace: str, team: str, url: str, backend: str):
        self.custom, self.core = client.CustomObjectsApi(kube_client), client.CoreV1Api(kube_client)
        self.namespace, self.name = namespace, team
        self.stacks = Stacks(kube_client, namespace, backend, operator)
        service_account = team_identity(platform, namespace, team)
        self.core.create_namespaced_secret(namespace, {"metadata": {"name": "pulumi"},
                                                       "stringData": {"passphrase": PASSPHRASE}})
        source = build_team_source(team, namespace, {"url": url, "interval": "10m"})
        sync = build_team_sync(team, namespace, service_account,
                               {"path": f"teams/{team}", "timeout": "1m", "substitute": {"STRATA_BACKEND": backend}})
        self.custom.create_namespaced_custom_object(*FLUX_SOURCE[:2], namespace, FLUX_SOURCE[2], source)
        self.custom.create_namespaced_custom_object(*KUSTOMIZE[:2], namespace, KUSTOMIZE[2], sync)

    def sync(self) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(*KUSTOMIZE[:2], self.namespace, KUSTOMIZE[2],
                                                        f"team-{self.name}")

    def wait_sync(self, predicate, what: str, timeout: float = 90) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def check():
            last["obj"] = self.sync()
            return last["obj"] if predicate(last["obj"]) else None

        try:
            return processes.wait_until(check, timeout, f"team {self.name}'s sync: {what}", interval=0.2)
        except processes.ProcessError as error:
            raise AssertionError(f"{error}; last status: {(last.get('obj') or {}).get('status')}") from None

    def wait_applied(self, commit: str) -> dict[str, Any]:
        return self.wait_sync(lambda o: has_condition(o, "Ready") and
                              (o.get("status") or {}).get("lastAppliedRevision", "").endswith(commit),
                              f"Ready at {commit[:8]}")

    def wait_refused(self, commit: str, *words: str) -> str:
        def refused(obj):
            ready = next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), {})
            return (ready.get("status") == "False" and (obj.get("status") or {}).get("lastAttemptedRevision", "")
                    .endswith(commit) and all(word in ready.get("message", "") for word in words))
        obj = self.wait_sync(refused, f"refused at {commit[:8]} ({', '.join(words)})")
        return next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")["message"]


@pytest.fixture
def teams(kube_client, local_platform, operator, namespace, tmp_path):
    """Alpha in this test's namespace and beta in one of its own, both synced from one repository."""
    core = client.CoreV1Api(kube_client)
    beta_namespace = unique("beta")
    backends = {team: (tmp_path / "state" / "teams" / team) for team in ("alpha", "beta")}
    for path in backends.values():
        path.mkdir(parents=True)
    # Each team's file:// state directory, as the platform layer annotates its namespace.
    core.create_namespace({"metadata": {"name": beta_namespace,
                                        "annotations": {FILE_BACKEND_ANNOTATION: backends["beta"].as_uri()}}})
    core.patch_namespace(namespace, {"metadata": {"annotations": {
        FILE_BACKEND_ANNOTATION: backends["alpha"].as_uri()}}})
    repository = unique("tenants")
    url = local_platform.git.create(repository, {
        "teams/alpha/kustomization.yaml": listing(), "teams/beta/kustomization.yaml": listing()})
    alpha = Team(kube_client, local_platform, operator, namespace, "alpha", url, backends["alpha"].as_uri())
    beta = Team(kube_client, local_platform, operator, beta_namespace, "beta", url, backends["beta"].as_uri())
    # What an attacker would be after: beta's passphrase.
    core.create_namespaced_secret(beta_namespace, {"metadata": {"name": "strata-pulumi-passphrase"},
                                                   "stringData": {"passphrase": "beta-only-3f9a1c"}})
    try:
        # Pushed to by the repository's owner (the platform's git server takes pushes with its credential only).
        yield alpha, beta, local_platform.git.push_url(repository), backends
    finally:
        core.delete_namespace(beta_namespace)


def test_a_team_commit_reaches_only_what_the_team_may_touch(teams, operator):
    alpha, beta, url, backends = teams
    backend = backends["alpha"].as_uri()
    legit = app(alpha.namespace, backend, "v1")
    commit = push(url, {**legit, "teams/alpha/kustomization.yaml": listing("program.yaml", "app.yaml")}, "alpha's app")
    alpha.wait_applied(commit)
    assert (alpha.stacks.get("app")["status"].get("outputs") or {}) == {"greeting": "v1"}
    beta.wait_applied(commit)

    # 1. A Stack in beta's namespace: refused by the API server, as alpha's ServiceAccount.
    intruder = stack(beta.namespace, "intruder", backends["beta"].as_uri(), programRef={"name": "app"})
    commit = push(url, {"teams/alpha/intruder.yaml": intruder,
                        "teams/alpha/kustomization.yaml": listing("program.yaml", "app.yaml", "intruder.yaml")},
                  "a Stack in beta's namespace")
    message = alpha.wait_refused(commit, "forbidden", f"system:serviceaccount:{alpha.namespace}:team-alpha")
    assert beta.namespace in message
    assert beta.stacks.get("intruder") is None
    assert has_condition(alpha.stacks.get("app"), "Ready")  # what alpha had keeps running

    # 2. A ClusterRoleBinding making alpha cluster-admin: refused, nothing bound.
    binding = yaml.safe_dump({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{alpha.namespace}-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "team-alpha", "namespace": alpha.namespace}]})
    commit = push(url, {"teams/alpha/intruder.yaml": None, "teams/alpha/admin.yaml": binding,
                        "teams/alpha/kustomization.yaml": listing("program.yaml", "app.yaml", "admin.yaml")},
                  "a ClusterRoleBinding")
    alpha.wait_refused(commit, "forbidden", "clusterrolebindings")
    with pytest.raises(client.ApiException) as missing:
        client.RbacAuthorizationV1Api(alpha.custom.api_client).read_cluster_role_binding(f"{alpha.namespace}-admin")
    assert missing.value.status == 404

    # 3. A Stack reading the operator's files through an FS ref (PKO v1's meaning), and 4. one reading
    # beta's passphrase through a Secret ref into beta's namespace: each stalls, naming the field.
    reader = stack(alpha.namespace, "reader", backend, programRef={"name": "app"},
                   secretsRef={"app:root": {"type": "FS", "filesystem": {"path": "/"}}})
    thief = stack(alpha.namespace, "thief", backend, programRef={"name": "app"},
                  envRefs={"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {
                      "name": "strata-pulumi-passphrase", "key": "passphrase", "namespace": beta.namespace}}})
    commit = push(url, {"teams/alpha/admin.yaml": None, "teams/alpha/reader.yaml": reader,
                        "teams/alpha/thief.yaml": thief,
                        "teams/alpha/kustomization.yaml": listing("program.yaml", "app.yaml", "reader.yaml",
                                                                  "thief.yaml")},
                  "Stacks reading what is not alpha's")
    stalled = condition(alpha.stacks.wait_stalled("reader", "SpecInvalid"), "Stalled")["message"]
    assert "spec.secretsRef.app:root.type" in stalled and "--operator-refs" in stalled
    stalled = condition(alpha.stacks.wait_stalled("thief", "CrossNamespaceRefForbidden"), "Stalled")["message"]
    assert "spec.envRefs.PULUMI_CONFIG_PASSPHRASE.secret.namespace" in stalled
    for name in ("reader", "thief"):
        assert not (alpha.stacks.get(name)["status"].get("lastUpdate")), f"{name} ran an update"
    # Flux says why alpha's sync is not healthy: the Stacks it applied are stalled.
    alpha.wait_refused(commit, "reader")
    assert "beta-only-3f9a1c" not in operator.log_text()
    assert not list(backends["beta"].iterdir()), "something wrote into beta's state"

    # Alpha's legitimate app keeps deploying once the attempts are gone.
    commit = push(url, {"teams/alpha/reader.yaml": None, "teams/alpha/thief.yaml": None,
                        **app(alpha.namespace, backend, "v2"),
                        "teams/alpha/kustomization.yaml": listing("program.yaml", "app.yaml")}, "alpha's app v2")
    alpha.wait_applied(commit)
    assert alpha.stacks.get("app")["status"]["outputs"] == {"greeting": "v2"}


def _reading(namespace: str, name: str, paths: dict[str, Path]) -> str:
    """A Program whose code reads each of `paths` (Pulumi YAML's fn::readFile opens any path the program's
    process can) and exports what it read: an attacker's program, run by the real engine."""
    program = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Program",
               "metadata": {"name": name, "namespace": namespace,
                            "annotations": {"kustomize.toolkit.fluxcd.io/substitute": "disabled"}},
               "program": {"outputs": {key: {"fn::readFile": str(path)} for key, path in paths.items()}}}
    return yaml.safe_dump(program)


def test_a_team_program_reads_nothing_of_the_operators_the_platforms_or_another_teams(
        teams, operator, local_platform):
    """6. A commit under alpha's path whose program looks around the host it runs on (the process executor's),
    for what made a team cluster-admin before: the operator's token, the platform's admin kubeconfig and the
    controller-manager's, the operator's own process, beta's state. Its program runs sandboxed: every read
    fails, none of it reaches its status, Events or the operator's log; and a Stack keeping its state in
    beta's directory stalls, naming spec.backend. Alpha's app keeps deploying."""
    alpha, beta, url, backends = teams
    backend = backends["alpha"].as_uri()
    (backends["beta"] / "state.json").write_text('{"checkpoint": "beta-state-7d41"}')
    platform_state = local_platform.state_dir
    targets = {"operatorKubeconfig": operator.state_dir.parent / "kubeconfig",
               "adminKubeconfig": local_platform.kubeconfig_path,
               "controllerManager": platform_state / "kubeconfigs" / "controller-manager.kubeconfig",
               "gitPushCredential": platform_state / "git-push.credentials",
               "operatorEnvironment": Path(f"/proc/{operator.pid()}/environ"),
               "betaState": backends["beta"] / "state.json"}
    secrets = {key: path.read_bytes().decode(errors="replace") for key, path in targets.items()}
    tokens = [line.split(":", 1)[1].strip() for text in secrets.values() for line in text.splitlines()
              if line.strip().startswith(("token:", "client-key-data:"))]
    assert len(tokens) >= 3 and all(secrets.values()), "the targets hold what an attacker would be after"
    snooper = stack(alpha.namespace, "snooper", backend, programRef={"name": "snoop"})
    thief = stack(alpha.namespace, "state-thief", backends["beta"].as_uri(), programRef={"name": "app"})
    legit = app(alpha.namespace, backend, "v1")
    commit = push(url, {**legit, "teams/alpha/snoop.yaml": _reading(alpha.namespace, "snoop", targets),
                        "teams/alpha/snooper.yaml": snooper, "teams/alpha/thief.yaml": thief,
                        "teams/alpha/kustomization.yaml": listing("program.yaml", "app.yaml", "snoop.yaml",
                                                                  "snooper.yaml", "thief.yaml")},
                  "a program reading the host")
    alpha.wait_sync(lambda o: (o.get("status") or {}).get("lastAttemptedRevision", "").endswith(commit),
                    f"attempted {commit[:8]}")
    failed = alpha.stacks.wait("snooper", lambda o: ((o.get("status") or {}).get("lastUpdate") or {}).get(
        "state") == "failed", 120, "its update failed")
    message = failed["status"]["lastUpdate"]["message"]
    for path in targets.values():
        assert f"Error reading file at path {path}" in message, (path, message)
    assert message.count("no such file or directory") >= len(targets), message
    stalled = condition(alpha.stacks.wait_stalled("state-thief", "SpecInvalid"), "Stalled")["message"]
    assert "spec.backend" in stalled and backends["alpha"].as_uri() in stalled
    assert not alpha.stacks.get("state-thief")["status"].get("lastUpdate"), "the thief ran an update"
    seen = "\n".join([str(alpha.stacks.get(name)["status"]) for name in ("snooper", "state-thief")] +
                     [str(e.message) for name in ("snooper", "state-thief") for e in alpha.stacks.events(name)] +
                     [operator.log_text()])
    for leaked in [*tokens, "beta-state-7d41", "beta-only-3f9a1c"]:
        assert leaked not in seen
    assert (backends["beta"] / "state.json").read_text() == '{"checkpoint": "beta-state-7d41"}'
    assert sorted(p.name for p in backends["beta"].iterdir()) == ["state.json"], "something wrote beta's state"
    assert alpha.stacks.wait_ready("app")["status"]["outputs"] == {"greeting": "v1"}

    commit = push(url, {"teams/alpha/snoop.yaml": None, "teams/alpha/snooper.yaml": None,
                        "teams/alpha/thief.yaml": None, **app(alpha.namespace, backend, "v2"),
                        "teams/alpha/kustomization.yaml": listing("program.yaml", "app.yaml")}, "alpha's app v2")
    alpha.wait_applied(commit)
    assert alpha.stacks.get("app")["status"]["outputs"] == {"greeting": "v2"}


def _objects(endpoint: str, bucket: str, credentials: s3.Credentials) -> list[str]:
    """Every object in `bucket`: its key, modification time and ETag."""
    status, body = s3.request(endpoint, "GET", f"/{bucket}", credentials, query={"list-type": "2"})
    assert status == 200, body
    return sorted(part.split("</ETag>")[0] for part in body.split("<Key>")[1:])


def test_a_team_commit_whose_stack_reads_another_teams_state_is_refused_by_the_object_store(teams, object_store):
    """5. State per team (the cluster stack's object store): alpha holds STS credentials for its own bucket
    only, in its namespace as the platform layer hands them over. A commit under alpha's path whose Stack
    keeps its state in beta's bucket - the engine lists and reads beta's state objects - fails with the
    store's AccessDenied, and nothing of beta's is read or changed."""
    alpha, beta, url, _backends = teams
    endpoint, root = object_store
    platform_bucket = f"tenancy-{uuid.uuid4().hex[:8]}"
    sessions = {}
    for team in ("alpha", "beta"):
        outs = TeamStateCredentialsProvider().create({
            "endpoint": endpoint, "bucket": s3.team_bucket(platform_bucket, team, f"teams ({team})"),
            "lifetime_seconds": 3600,
            "store_credentials": {"access_key_id": root.access_key_id,
                                  "secret_access_key": root.secret_access_key}}).outs
        sessions[team] = (outs["bucket"], s3.Credentials(outs["access_key_id"], outs["secret_access_key"],
                                                         outs["session_token"]))
    (alpha_bucket, alpha_credentials), (beta_bucket, beta_credentials) = sessions["alpha"], sessions["beta"]
    alpha.core.create_namespaced_secret(alpha.namespace, {"metadata": {"name": "strata-state-credentials"},
                                                          "stringData": dict(zip(s3.CREDENTIAL_ENV, (
                                                              alpha_credentials.access_key_id,
                                                              alpha_credentials.secret_access_key,
                                                              alpha_credentials.session_token)))})
    # beta's state, as beta's own updates leave it.
    status, _ = s3.request(endpoint, "PUT", f"/{beta_bucket}/.pulumi/stacks/strata-app-team/beta.json",
                           beta_credentials, payload=b'{"version": 3, "checkpoint": {"stack": "beta-only-5e2d"}}')
    assert status == 200
    before = _objects(endpoint, beta_bucket, root)

    def backend(bucket: str) -> str:
        return f"s3://{bucket}?endpoint={endpoint}&use_path_style=true&region={s3.REGION}"

    env_refs = {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": "pulumi", "key": "passphrase"}},
                **{name: {"type": "Secret", "secret": {"name": "strata-state-credentials", "key": name}}
                   for name in s3.CREDENTIAL_ENV}}
    # Never destroyed (its destroy would be refused too, holding the namespace's deletion).
    snoop = stack(alpha.namespace, "snoop", backend(beta_bucket), programRef={"name": "app"}, envRefs=env_refs,
                  destroyOnFinalize=False)
    legit = app(alpha.namespace, backend(alpha_bucket), "v1", envRefs=env_refs)
    commit = push(url, {**legit, "teams/alpha/snoop.yaml": snoop,
                        "teams/alpha/kustomization.yaml": listing("program.yaml", "app.yaml", "snoop.yaml")},
                  "a Stack keeping its state in beta's bucket")
    alpha.wait_sync(lambda o: (o.get("status") or {}).get("lastAttemptedRevision", "").endswith(commit),
                    f"attempted {commit[:8]}")
    failed = alpha.stacks.wait("snoop", lambda o: "AccessDenied" in (
        ((o.get("status") or {}).get("lastUpdate") or {}).get("message", "")), 180,
        "its update refused by the store (AccessDenied)")
    assert failed["status"]["lastUpdate"]["state"] == "failed"
    assert "beta-only-5e2d" not in str(failed["status"]) and "beta-only-5e2d" not in str(
        [e.message for e in alpha.stacks.events("snoop")])
    assert _objects(endpoint, beta_bucket, root) == before, "something changed beta's state"
    # Alpha's own Stack, on alpha's bucket with the same credentials, deploys.
    ready = alpha.stacks.wait_ready("app", timeout=180)
    assert ready["status"]["outputs"] == {"greeting": "v1"}
    assert _objects(endpoint, alpha_bucket, root)


def test_ready_means_the_newest_commit_ran(teams, operator):
    """Waiting only on the team's Kustomization, as `flux get kustomizations` and `make up` do: once it is
    Ready at a commit, its Stack has run that commit. A Stack the operator has not seen yet reads as in
    progress (its CRD defaults status.observedGeneration to -1), and a Ready Stack says Reconciling as soon
    as its source has a revision it has not run, so kstatus never reads the previous run's Ready as current."""
    alpha, _, url, backends = teams
    backend = backends["alpha"].as_uri()
    project = yaml.safe_dump({"name": "fleet", "runtime": "yaml", **stash_program(round="0")}, sort_keys=False)
    synced = stack(alpha.namespace, "fleet", backend, fluxSource={
        "sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "team-alpha"},
        "dir": "programs/fleet"})
    # With no operator running, the new Stack is applied and never reads as healthy.
    operator.stop()
    try:
        commit = push(url, {"programs/fleet/Pulumi.yaml": project, "teams/alpha/fleet.yaml": synced,
                            "teams/alpha/kustomization.yaml": listing("fleet.yaml")}, "fleet")
        alpha.wait_sync(lambda o: (o.get("status") or {}).get("lastAttemptedRevision", "").endswith(commit) and
                        alpha.stacks.get("fleet") is not None, "the new Stack applied")
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert not alpha.sync()["status"].get("lastAppliedRevision", "").endswith(commit) or not has_condition(
                alpha.sync(), "Ready"), "the sync was Ready before any operator had seen its Stack"
            time.sleep(0.5)
    finally:
        operator.start()
    alpha.wait_applied(commit)
    assert alpha.stacks.get("fleet")["status"]["outputs"] == {"round": "0"}
    for round_ in range(1, 6):
        project = yaml.safe_dump({"name": "fleet", "runtime": "yaml", **stash_program(round=str(round_))},
                                 sort_keys=False)
        pushed = time.monotonic()
        commit = push(url, {"programs/fleet/Pulumi.yaml": project}, f"round {round_}")
        alpha.wait_applied(commit)
        fleet = alpha.stacks.get("fleet")
        assert fleet["status"]["lastUpdate"]["lastSuccessfulCommit"].endswith(commit), (
            f"round {round_}: the Kustomization was Ready at {commit[:8]} before its Stack ran it: {fleet['status']}")
        assert fleet["status"]["outputs"] == {"round": str(round_)}
        print(f"round {round_}: push -> Kustomization Ready with the Stack at the commit: "
              f"{time.monotonic() - pushed:.1f}s")
