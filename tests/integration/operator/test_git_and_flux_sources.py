"""Git (commit, branch) and Flux sources (GitRepository end to end; OCIRepository and Bucket read and watched)."""

from datetime import datetime, timezone

from strata_components.local import processes

from .conftest import MIN_RESYNC_SECONDS, eventually_constant, stash_project

FLUX = ("source.toolkit.fluxcd.io", "v1")


def test_git_commit_with_repo_dir(stacks, local_platform):
    repo = f"{stacks.namespace}-commit"
    url = local_platform.git.create(repo, {"README.md": "not a project\n",
                                           "infra/Pulumi.yaml": stash_project("pinned", colour="blue")})
    sha = local_platform.git.commit(repo, {"infra/Pulumi.yaml": stash_project("pinned", colour="green")})
    local_platform.git.commit(repo, {"infra/Pulumi.yaml": stash_project("pinned", colour="red")})  # not deployed

    stacks.create("pinned", stacks.spec(projectRepo=url, commit=sha, repoDir="infra"))
    obj = stacks.wait_ready("pinned", 90)
    assert obj["status"]["outputs"] == {"colour": "green"}
    assert obj["status"]["lastUpdate"]["lastSuccessfulCommit"] == sha


def test_git_branch_follows_new_commits_and_is_silent_otherwise(stacks, local_platform):
    repo = f"{stacks.namespace}-branch"
    url = local_platform.git.create(repo, {"Pulumi.yaml": stash_project("tracked", colour="blue")})
    stacks.create("tracked", stacks.spec(projectRepo=url, branch="main"))
    first = stacks.wait_ready("tracked", 90)["status"]["lastUpdate"]

    # Several poll periods with the branch unchanged: ls-remote only, zero engine runs, no status writes.
    unchanged = eventually_constant(lambda: (stacks.runs("tracked"), stacks.get("tracked")["metadata"]["resourceVersion"]),
                                    3 * MIN_RESYNC_SECONDS + 1)
    assert unchanged[0] == 1

    sha = local_platform.git.commit(repo, {"Pulumi.yaml": stash_project("tracked", colour="green")})
    obj = stacks.wait("tracked", lambda o: o["status"]["lastUpdate"].get("lastSuccessfulCommit") == sha,
                      MIN_RESYNC_SECONDS + 60, "re-run for the new branch head")
    assert obj["status"]["outputs"] == {"colour": "green"}
    assert obj["status"]["lastUpdate"]["name"] != first["name"]
    assert stacks.runs("tracked") == 2
    assert any(sha in e.message for e in stacks.events("tracked", "StackUpdateDetected"))


def _git_repository(stacks, name: str, url: str) -> None:
    stacks.custom.create_namespaced_custom_object(*FLUX, stacks.namespace, "gitrepositories", {
        "apiVersion": "/".join(FLUX), "kind": "GitRepository", "metadata": {"name": name},
        "spec": {"url": url, "interval": "1h", "ref": {"branch": "main"}}})


def _artifact_revision(stacks, name: str) -> str:
    obj = stacks.custom.get_namespaced_custom_object(*FLUX, stacks.namespace, "gitrepositories", name)
    return ((obj.get("status") or {}).get("artifact") or {}).get("revision", "")


def test_flux_git_repository_source_and_new_artifact_revision(stacks, local_platform):
    repo = f"{stacks.namespace}-flux"
    local_platform.git.create(repo)
    sha = local_platform.git.commit(repo, {"deploy/Pulumi.yaml": stash_project("fluxed", colour="blue")})
    _git_repository(stacks, "infra", local_platform.git.url(repo))
    stacks.create("fluxed", stacks.spec(fluxSource={
        "sourceRef": {"apiVersion": "/".join(FLUX), "kind": "GitRepository", "name": "infra"}, "dir": "deploy"}))
    obj = stacks.wait_ready("fluxed", 120)
    assert obj["status"]["outputs"] == {"colour": "blue"}
    assert obj["status"]["lastUpdate"]["lastSuccessfulCommit"] == f"main@sha1:{sha}"

    # A new commit, fetched now (as `flux reconcile source git`): the new artifact revision re-runs the Stack.
    sha = local_platform.git.commit(repo, {"deploy/Pulumi.yaml": stash_project("fluxed", colour="green")})
    stacks.custom.patch_namespaced_custom_object(*FLUX, stacks.namespace, "gitrepositories", "infra", {
        "metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": datetime.now(timezone.utc).isoformat()}}})
    processes.wait_until(lambda: _artifact_revision(stacks, "infra") == f"main@sha1:{sha}", 60,
                         "GitRepository artifact for the new commit")
    obj = stacks.wait("fluxed", lambda o: o["status"]["lastUpdate"].get("lastSuccessfulCommit") == f"main@sha1:{sha}",
                      90, "re-run for the new artifact revision")
    assert obj["status"]["outputs"] == {"colour": "green"}
    assert stacks.runs("fluxed") == 2


def test_flux_source_missing_then_created(stacks, local_platform):
    spec = stacks.spec(fluxSource={"sourceRef": {"apiVersion": "/".join(FLUX), "kind": "GitRepository",
                                                 "name": "later"}})
    stacks.create("waiting", spec)
    stalled = stacks.wait_stalled("waiting", "SourceUnavailable", 60)
    assert "later" in next(c for c in stalled["status"]["conditions"] if c["type"] == "Stalled")["message"]

    url = local_platform.git.create(f"{stacks.namespace}-later", {"Pulumi.yaml": stash_project("later", n="1")})
    _git_repository(stacks, "later", url)
    assert stacks.wait_ready("waiting", 120)["status"]["outputs"] == {"n": "1"}


def test_oci_repository_and_bucket_sources_are_read_and_watched(stacks):
    """The other Flux source kinds, against the real source-controller: each is read under the operator's
    RBAC, and its failure (nothing serves OCI or S3 here) reaches the Stack when the controller reports it."""
    sources = {
        "OCIRepository": ("ocirepositories", {"url": "oci://127.0.0.1:9/strata/app", "insecure": True,
                                              "interval": "1h", "ref": {"tag": "latest"}}),
        "Bucket": ("buckets", {"provider": "generic", "bucketName": "app", "endpoint": "127.0.0.1:9",
                               "insecure": True, "interval": "1h"}),
    }
    for kind, (plural, source_spec) in sources.items():
        name = kind.lower()
        stacks.custom.create_namespaced_custom_object(*FLUX, stacks.namespace, plural, {
            "apiVersion": "/".join(FLUX), "kind": kind, "metadata": {"name": name}, "spec": source_spec})
        stacks.create(name, stacks.spec(fluxSource={"sourceRef": {"apiVersion": "/".join(FLUX), "kind": kind,
                                                                  "name": name}}))
    for kind in sources:
        name = kind.lower()

        def reports_the_controllers_failure(obj, kind=kind, name=name):
            stalled = next((c for c in (obj.get("status") or {}).get("conditions") or []
                            if c["type"] == "Stalled" and c["status"] == "True"), None)
            message = (stalled or {}).get("message", "")
            return (stalled or {}).get("reason") == "SourceUnavailable" and f"{kind} {name!r} is not Ready" in message \
                and "no Ready condition yet" not in message

        obj = stacks.wait(name, reports_the_controllers_failure, 90, f"{kind} failure on the Stack")
        assert stacks.runs(name) == 0
        assert not (obj["status"].get("lastUpdate") or {}).get("lastSuccessfulCommit")
