"""ProjectRepo: files of a project committed to a repository of the local platform's git server.

In local mode the operator runs the platform program from git like any other Stack. This resource
publishes what that Stack needs (the program and the library its requirements install) to the
platform's own git server, so `pulumi up -s dev` needs no remote. Publishing is idempotent: the
same files give the same commit, no new one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

import pulumi
import pulumi.dynamic
from typing_extensions import NotRequired

from .cluster import plan_change
from .local.gitserver import GitRepos, blob_sha

# What programs/platform installs from its requirements (`../..`): the package metadata and both packages;
# and what Flux syncs (clusters/).
DEFAULT_INCLUDE = ("pyproject.toml", "components", "operator/strata_operator", "programs", "clusters")
# Local build and run leftovers that never belong in the published tree.
SKIPPED_DIRS = frozenset({"__pycache__", ".venv", "venv", ".pytest_cache", ".pulumi", "node_modules"})


class ProjectRepoArgs(TypedDict):
    state_dir: str
    """State directory of the local platform whose git server receives the files."""
    git_url: pulumi.Input[str]
    """Base URL of that git server (the Cluster's `git_url`); orders this after the platform."""
    source_dir: str
    """Root of the project the files are taken from."""
    include: NotRequired[Sequence[str]]
    """Files and directories under `source_dir` to publish (default: what programs/platform installs)."""
    name: NotRequired[str]
    """Repository name (default strata): served as `<git_url>/<name>.git`."""
    branch: NotRequired[str]
    """Branch the files are committed to (default main)."""


def collect_files(root: Path, include: Sequence[str]) -> dict[str, str]:
    """Text of every file under the `include` paths of `root`, by POSIX path relative to `root`."""
    files: dict[str, str] = {}
    for entry in include:
        path = root / entry
        if not path.exists():
            raise ValueError(f"project repo: {entry!r} does not exist under {root}; fix `include` or `source_dir`")
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for candidate in candidates:
            relative = candidate.relative_to(root)
            if SKIPPED_DIRS & set(relative.parts) or candidate.suffix == ".pyc" or any(
                    part.endswith(".egg-info") for part in relative.parts):
                continue
            try:
                files[relative.as_posix()] = candidate.read_text()
            except UnicodeDecodeError:
                raise ValueError(f"project repo: {relative} is not text; leave it out of `include`") from None
    if not files:
        raise ValueError(f"project repo: no files under {list(include)} in {root}")
    return files


def files_digest(files: dict[str, str]) -> str:
    """A digest of paths and contents: equal digests, equal trees."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\0{len(files[path])}\0".encode() + files[path].encode())
    return digest.hexdigest()


def _repos(props: dict[str, Any]) -> GitRepos:
    # Imported here: the provider runs in its own process, and mocks-only tests never start a platform.
    from strata_components.local.platform import LocalPlatform, PlatformConfig

    return LocalPlatform(PlatformConfig(state_dir=Path(props["state_dir"]))).info().git


def publish(repos: GitRepos, name: str, files: dict[str, str], branch: str = "main") -> str:
    """Make `branch` of repository `name` hold exactly `files`, committing only when it does not yet;
    returns the branch's commit."""
    try:
        repos.create(name, branch=branch)
    except FileExistsError:
        pass
    current = repos.tree(name, branch)
    if current and current == {path: blob_sha(content) for path, content in files.items()}:
        return repos.head(name, branch)
    removed = {path: None for path in current if path not in files}
    return repos.commit(name, {**files, **removed}, message=f"publish {files_digest(files)[:12]}", branch=branch)


class ProjectRepoProvider(pulumi.dynamic.ResourceProvider):
    """Publishes on create/update; deletes the repository on delete."""

    def _outputs(self, props: dict[str, Any]) -> dict[str, Any]:
        repos = _repos(props)
        files = collect_files(Path(props["source_dir"]), props["include"])
        return {**props, "url": repos.url(props["name"]),
                "commit": publish(repos, props["name"], files, props["branch"])}

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(id_=f"{props['state_dir']}#{props['name']}", outs=self._outputs(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        # "running": the branch still points at the published commit (not reset, not deleted).
        try:
            head = _repos(olds).head(olds["name"], olds["branch"])
        except FileNotFoundError:  # the platform's state directory is gone: publish again
            head = None
        return plan_change(olds, news, replace_on=("state_dir", "name"),
                           update_on=("git_url", "source_dir", "include", "branch", "digest"),
                           running=head == olds.get("commit"))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        return pulumi.dynamic.UpdateResult(outs=self._outputs(news))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _repos(props).delete(props["name"])


class ProjectRepo(pulumi.dynamic.Resource):
    """A repository on the local platform's git server holding a project's files."""

    url: pulumi.Output[str]
    """Clone URL of the repository."""
    commit: pulumi.Output[str]
    """Commit sha holding exactly the published files."""

    def __init__(self, name: str, args: ProjectRepoArgs, opts: pulumi.ResourceOptions | None = None):
        source_dir = Path(args["source_dir"]).expanduser().resolve()
        include = list(args.get("include", DEFAULT_INCLUDE))
        props = {
            "state_dir": str(Path(args["state_dir"]).expanduser()), "git_url": args["git_url"],
            "source_dir": str(source_dir), "include": include, "name": args.get("name", "strata"),
            "branch": args.get("branch", "main"),
            # Read when the program runs, so a changed file is a diff even though the provider reads the files.
            "digest": files_digest(collect_files(source_dir, include)),
            "url": None, "commit": None,
        }
        super().__init__(ProjectRepoProvider(), name, props, opts)
