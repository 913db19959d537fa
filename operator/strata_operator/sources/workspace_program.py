"""What a pass over a PKO v2 Workspace (`auto.pulumi.com/v1alpha1`) needs beyond its spec: its environment
from Secrets and ConfigMaps as a pod would get it, its stacks' config, its git credentials, and its program
fetched into a workdir (git, a Flux artifact URL, or a host directory).

`local.dir` (a directory in PKO's workspace image) is read from the operator's host only where operator
refs are allowed (`--operator-refs`, as for FS refs; off by default), and is copied, never run in place.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from ..api.workspace import (SECRET_VARIABLES, FluxSource, GitAuthRefs, GitSource, KeyRef, ProjectInfoSource,
                             WorkspaceSpec, WorkspaceStack)
from ..api.workspace_values import ConfigUnavailable, config_values
from ..services.redaction import redactor_for
from .archive import DEFAULT_MAX_SOURCE_BYTES, SizeCap, SourceError, byte_size, safe_extract, tree_bytes
from .flux import FluxArtifact, download_artifact
from .git import KNOWN_HOSTS_KEY, GitCredentials, GitHubApp, git_branch_head, git_checkout
from .project import subdir
from .references import ReadMap, RefError

_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")


@dataclasses.dataclass(frozen=True)
class WorkspaceEnv:
    env: dict[str, str]
    secret_env: frozenset[str]


async def resolve_env(spec: WorkspaceSpec, namespace: str, read_secret: ReadMap,
                      read_configmap: ReadMap) -> WorkspaceEnv:
    """The workspace's environment as a pod would get it (envFrom, then env over it, plus PKO's
    POD_NAMESPACE and POD_SA_NAME). Secret values are registered with the namespace's redactor as they are
    read; RefError names the field of a missing Secret, ConfigMap or key."""
    redactor = redactor_for(namespace)
    env: dict[str, str] = {"POD_NAMESPACE": namespace, "POD_SA_NAME": spec.service_account_name}
    secret: set[str] = set()

    def put(name: str, value: str, is_secret: bool) -> None:
        env[name] = value
        (secret.add if is_secret else secret.discard)(name)

    for index, source in enumerate(spec.env_from):
        read = read_secret if source.kind == "Secret" else read_configmap
        data = await read(namespace, source.name)
        if data is None:
            if source.optional:
                continue
            key = "secretRef" if source.kind == "Secret" else "configMapRef"
            raise RefError(f"spec.envFrom[{index}].{key}: {source.kind} {source.name!r} not found in namespace "
                           f"{namespace!r}")
        if source.kind == "Secret":
            redactor.add(*data.values())
        for key, value in data.items():
            put(source.prefix + key, value, source.kind == "Secret")
    for var in spec.env:
        ref, kind = (var.secret, "Secret") if var.secret else (var.config_map, "ConfigMap")
        if var.field_path:
            put(var.name, namespace if var.field_path == "metadata.namespace" else spec.service_account_name, False)
        elif ref is None:
            put(var.name, var.value, False)
        else:
            data = await (read_secret if kind == "Secret" else read_configmap)(namespace, ref.name)
            key = "secretKeyRef" if kind == "Secret" else "configMapKeyRef"
            if data is None or ref.key not in data:
                if ref.optional:
                    continue
                what = f"{kind} {ref.name!r} not found in namespace {namespace!r}" if data is None else \
                    f"{kind} {ref.name!r} has no key {ref.key!r}"
                raise RefError(f"spec.env[{var.name}].valueFrom.{key}: {what}")
            if kind == "Secret":
                redactor.add(data[ref.key])
            put(var.name, data[ref.key], kind == "Secret")
    for name in sorted(SECRET_VARIABLES):
        if name in env:
            redactor.add(env[name])
            secret.add(name)
    return WorkspaceEnv(env, frozenset(secret))


async def git_credentials(auth: GitAuthRefs | None, namespace: str, read_secret: ReadMap) -> GitCredentials | None:
    """spec.git.auth's Secrets, in PKO's order (ssh key, token, username/password, GitHub App); with an SSH
    key, the host keys to trust are its Secret's known_hosts (Flux's convention), if it has one."""
    if auth is None:
        return None
    redactor = redactor_for(namespace)

    async def value(ref: KeyRef | None, field: str) -> str:
        if ref is None:
            return ""
        data = await read_secret(namespace, ref.name)
        if data is None or ref.key not in data:
            if ref.optional:
                return ""
            raise RefError(f"spec.git.auth.{field}: Secret {ref.name!r} with key {ref.key!r} not found in namespace "
                           f"{namespace!r}")
        redactor.add(data[ref.key])
        return data[ref.key]

    if auth.ssh_private_key:
        beside_key = await read_secret(namespace, auth.ssh_private_key.name)
        return GitCredentials(ssh_private_key=await value(auth.ssh_private_key, "sshPrivateKey"),
                              ssh_passphrase=await value(auth.password, "password"),
                              known_hosts=(beside_key or {}).get(KNOWN_HOSTS_KEY, ""), redactor=redactor)
    if auth.token:
        return GitCredentials(token=await value(auth.token, "token"), redactor=redactor)
    if auth.username:
        return GitCredentials(username=await value(auth.username, "username"),
                              password=await value(auth.password, "password"), redactor=redactor)
    if auth.github_app:
        app_id, installation, key = auth.github_app
        return GitCredentials(github_app=GitHubApp(await value(app_id, "githubApp.appID"),
                                                   await value(installation, "githubApp.installationID"),
                                                   await value(key, "githubApp.privateKey")), redactor=redactor)
    return None


def stack_config(stack: WorkspaceStack | None, env: dict[str, str],
                 namespace: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(config, secret config) of a Workspace's stack, with valueFrom.env read from the workspace's
    environment as PKO's agent does (the secret values registered with the namespace's redactor); RefError
    names the item."""
    try:
        config, secrets = config_values(stack.config if stack else (), env)
    except ConfigUnavailable as err:
        raise RefError(str(err)) from None
    redactor_for(namespace).add(*secrets.values())
    return config, secrets


def resolve_git_ref(url: str, ref: str, creds: GitCredentials | None, host_key_pin: Path) -> str:
    """The commit to check out for spec.git.ref: a SHA as given, else the branch, else the tag."""
    if _COMMIT.match(ref):
        return ref
    if ref.startswith("refs/"):
        return git_branch_head(url, ref, creds, host_key_pin)
    try:
        return git_branch_head(url, ref, creds, host_key_pin)
    except SourceError as err:
        if "not found" not in str(err):
            raise
    try:
        return git_branch_head(url, f"refs/tags/{ref}", creds, host_key_pin)
    except SourceError as err:
        if "not found" not in str(err):
            raise
    raise SourceError(f"spec.git.ref: {ref!r} is neither a branch nor a tag of {url}")


def materialise(spec: WorkspaceSpec, dest: Path, creds: GitCredentials | None, host_key_pin: Path,
                allow_host_dirs: bool, max_bytes: int = DEFAULT_MAX_SOURCE_BYTES) -> tuple[Path, str]:
    """Write the workspace's program into `dest` (blocking: run it on a source thread), no larger than
    `max_bytes` (--max-source-bytes, see archive.SizeCap). Returns (project directory, revision);
    SourceError says why not, naming the field. `host_key_pin`: the Workspace's file of pinned SSH host
    keys (git.HostKeys)."""
    source = spec.source
    if isinstance(source, ProjectInfoSource):
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "Pulumi.yaml").write_text(json.dumps({"name": source.name, "runtime": source.runtime}) + "\n")
        return dest, f"projectInfo:{source.name}"
    if isinstance(source, GitSource):
        commit = resolve_git_ref(source.url, source.ref, creds, host_key_pin)
        revision = git_checkout(source.url, commit, dest, creds, host_key_pin, cap=SizeCap(max_bytes, "spec.git.url"))
        return subdir(dest, source.dir.lstrip("/"), "spec.git.dir"), revision
    if isinstance(source, FluxSource):
        dest.mkdir(parents=True, exist_ok=True)
        archive, cap = dest.parent / (dest.name + ".tar.gz"), SizeCap(max_bytes, "spec.flux.url")
        try:
            download_artifact(FluxArtifact(source.url, "", source.digest), archive, cap)
            safe_extract(archive, dest, cap)
        finally:
            archive.unlink(missing_ok=True)
        return subdir(dest, source.dir.lstrip("/"), "spec.flux.dir"), source.digest
    if not allow_host_dirs:
        raise SourceError(f"spec.local.dir: {source.dir!r} would be read from the operator's own files, which "
                          "this operator does not allow (fix: use spec.git or spec.flux, or start the operator "
                          "with --operator-refs)")
    if not os.path.isfile(os.path.join(source.dir, "Pulumi.yaml")) and \
            not os.path.isfile(os.path.join(source.dir, "Pulumi.yml")):
        raise SourceError(f"spec.local.dir: {source.dir!r} holds no Pulumi project on the operator's host (PKO reads "
                          "it from its workspace image, which the process executor does not run) (fix: put the "
                          "project there, or use spec.git or spec.flux)")
    files = tree_bytes(Path(source.dir))
    if files > max_bytes:
        raise SizeCap(max_bytes, "spec.local.dir").refusal(f"{source.dir!r} ({byte_size(files)} of files)")
    shutil.copytree(source.dir, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    return dest, f"local:{source.dir}"
