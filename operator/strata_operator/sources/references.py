"""Turn a Stack's references (envRefs, secretsRef, configRef, gitAuth and the deprecated v1 fields) into
the values one update needs. Every value read from a Secret is registered with the redactor of the
Stack's namespace first; Literal and ConfigMap values and plain spec fields are not secrets and stay
readable.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from ..api.stack import ResourceRef, StackSpec
from ..api.workspace_values import MountedRefs
from ..services.redaction import redactor_for
from .git import KNOWN_HOSTS_KEY, GitCredentials, GitHubApp

ReadMap = Callable[[str, str], Awaitable[dict[str, str] | None]]  # (namespace, name) -> data or None


class RefError(Exception):
    """A reference cannot be resolved now (missing Secret or key); names the field."""


@dataclasses.dataclass(frozen=True)
class Resolved:
    env: dict[str, str]
    config: dict[str, Any]
    secret_config: dict[str, str]
    git: GitCredentials | None
    secret_env: frozenset[str] = frozenset()
    """The `env` entries whose values are secret: from Secrets, the operator's own env and files, and
    the passphrase and access token however given."""
    mounted: MountedRefs = MountedRefs()
    """With the pod executor: the references left for the workspace pod to resolve (never read here)."""


def _mounted_ref(ref: ResourceRef) -> dict[str, Any]:
    """A non-literal ref as the workspace pod resolves it: a Secret key, or its own env or file (PKO v2)."""
    if ref.type == "Secret":
        return {"secret": {"name": ref.secret.name, "key": ref.secret.key}}  # type: ignore[union-attr]
    if ref.type == "Env":
        return {"env": ref.env.name}  # type: ignore[union-attr]
    return {"file": ref.filesystem.path}  # type: ignore[union-attr]


async def resolve_ref(field: str, ref: ResourceRef, namespace: str, read_secret: ReadMap,
                      allow_operator_refs: bool) -> str:
    if ref.type == "Literal":
        return ref.literal.value  # type: ignore[union-attr]
    if ref.type == "Secret":
        sel = ref.secret
        data = await read_secret(namespace, sel.name)  # type: ignore[union-attr]
        if data is None:
            raise RefError(f"{field}.secret: Secret {sel.name!r} not found in namespace {namespace!r}")  # type: ignore[union-attr]
        if sel.key not in data:  # type: ignore[union-attr]
            raise RefError(f"{field}.secret.key: Secret {sel.name!r} has no key {sel.key!r}")  # type: ignore[union-attr]
        value = data[sel.key]  # type: ignore[union-attr]
        redactor_for(namespace).add(value)
        return value
    if not allow_operator_refs:
        raise RefError(f"{field}.type: {ref.type!r} refs read the operator's own environment or files and are "
                       "disabled; use a Secret ref")
    if ref.type == "Env":
        value = os.environ.get(ref.env.name)  # type: ignore[union-attr]
        if value is None:
            raise RefError(f"{field}.env.name: the operator has no environment variable {ref.env.name!r}")  # type: ignore[union-attr]
    else:
        try:
            with open(ref.filesystem.path) as f:  # type: ignore[union-attr]
                value = f.read()
        except OSError as err:
            raise RefError(f"{field}.filesystem.path: cannot read {ref.filesystem.path!r}: {err.strerror}") from None  # type: ignore[union-attr]
    redactor_for(namespace).add(value)
    return value


async def _git_credentials(spec: StackSpec, namespace: str, read_secret: ReadMap,
                           allow_operator_refs: bool) -> GitCredentials | None:
    async def ref(field: str, r: ResourceRef) -> str:
        return await resolve_ref(field, r, namespace, read_secret, allow_operator_refs)

    redactor = redactor_for(namespace)
    auth = spec.git_auth
    if auth is not None:
        if auth.ssh_auth is not None:
            key = auth.ssh_auth.ssh_private_key
            # The host keys to trust are the key's Secret's known_hosts, as in a Flux GitRepository's Secret.
            key_secret = key.secret.name if key.type == "Secret" else ""  # type: ignore[union-attr]
            beside_key = await read_secret(namespace, key_secret) if key_secret else None
            return GitCredentials(
                ssh_private_key=await ref("spec.gitAuth.sshAuth.sshPrivateKey", key),
                ssh_passphrase=(await ref("spec.gitAuth.sshAuth.password", auth.ssh_auth.password)
                                if auth.ssh_auth.password else ""),
                known_hosts=(beside_key or {}).get(KNOWN_HOSTS_KEY, ""), redactor=redactor)
        if auth.access_token is not None:
            return GitCredentials(token=await ref("spec.gitAuth.accessToken", auth.access_token), redactor=redactor)
        if auth.basic_auth is not None:
            return GitCredentials(username=await ref("spec.gitAuth.basicAuth.userName", auth.basic_auth.user_name),
                                  password=await ref("spec.gitAuth.basicAuth.password", auth.basic_auth.password),
                                  redactor=redactor)
        if auth.github_app is not None:
            app = auth.github_app
            return GitCredentials(github_app=GitHubApp(
                app_id=await ref("spec.gitAuth.githubApp.appID", app.app_id),
                installation_id=await ref("spec.gitAuth.githubApp.installationID", app.installation_id),
                private_key=await ref("spec.gitAuth.githubApp.privateKey", app.private_key)), redactor=redactor)
    if spec.git_auth_secret:
        data = await read_secret(namespace, spec.git_auth_secret)
        if data is None:
            raise RefError(f"spec.gitAuthSecret: Secret {spec.git_auth_secret!r} not found")
        redactor.add(*data.values())
        # PKO's precedence: ssh key, then access token, then basic auth.
        if data.get("sshPrivateKey"):
            return GitCredentials(ssh_private_key=data["sshPrivateKey"], ssh_passphrase=data.get("password", ""),
                                  known_hosts=data.get(KNOWN_HOSTS_KEY, ""), redactor=redactor)
        if data.get("accessToken"):
            return GitCredentials(token=data["accessToken"], redactor=redactor)
        if data.get("username") and data.get("password"):
            return GitCredentials(username=data["username"], password=data["password"], redactor=redactor)
        raise RefError(f"spec.gitAuthSecret: Secret {spec.git_auth_secret!r} has none of sshPrivateKey, "
                       "accessToken, username+password")
    return None


async def resolve_stack(spec: StackSpec, namespace: str, read_secret: ReadMap, read_configmap: ReadMap,
                        allow_operator_refs: bool = True, mount_secrets: bool = False) -> Resolved:
    """`mount_secrets` (the pod executor): the Stack's Secrets, Env and FS refs are left to its workspace
    pod, which gets the Secrets from the kubelet; only ConfigMaps, literals and git credentials (the
    operator fetches the source) are read here."""
    redactor = redactor_for(namespace)
    env: dict[str, str] = {}
    secret_env: set[str] = set()
    mounted_env: dict[str, dict[str, Any]] = {}
    env_from: list[str] = []
    mounted_config: dict[str, dict[str, Any]] = {}

    def put(values: dict[str, str], secret: bool) -> None:
        env.update(values)
        if secret:
            secret_env.update(values)
        else:
            secret_env.difference_update(values)

    for name in spec.envs:
        data = await read_configmap(namespace, name)
        if data is None:
            raise RefError(f"spec.envs: ConfigMap {name!r} not found")
        put(data, secret=False)
    for name in spec.env_secrets if mount_secrets else ():
        env_from.append(name)
    for name in () if mount_secrets else spec.env_secrets:
        data = await read_secret(namespace, name)
        if data is None:
            raise RefError(f"spec.envSecrets: Secret {name!r} not found")
        redactor.add(*data.values())
        put(data, secret=True)
    if spec.access_token_secret and mount_secrets:
        mounted_env["PULUMI_ACCESS_TOKEN"] = {"secret": {"name": spec.access_token_secret, "key": "accessToken"}}
    elif spec.access_token_secret:
        data = await read_secret(namespace, spec.access_token_secret)
        if data is None or "accessToken" not in data:
            raise RefError(f"spec.accessTokenSecret: Secret {spec.access_token_secret!r} with key 'accessToken' not found")
        redactor.add(data["accessToken"])
        put({"PULUMI_ACCESS_TOKEN": data["accessToken"]}, secret=True)
    for key, ref in sorted(spec.env_refs.items()):
        if mount_secrets and ref.type != "Literal":
            mounted_env[key] = _mounted_ref(ref)
            env.pop(key, None)
            continue
        mounted_env.pop(key, None)
        value = await resolve_ref(f"spec.envRefs.{key}", ref, namespace, read_secret, allow_operator_refs)
        put({key: value}, secret=ref.type != "Literal")
    if spec.backend:
        put({"PULUMI_BACKEND_URL": spec.backend}, secret=False)
        mounted_env.pop("PULUMI_BACKEND_URL", None)
    for secret_name in ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_ACCESS_TOKEN"):
        if secret_name in env:
            redactor.add(env[secret_name])
            secret_env.add(secret_name)

    config: dict[str, Any] = dict(spec.config)
    for key, cref in sorted(spec.config_ref.items()):
        data = await read_configmap(namespace, cref.name)
        if data is None or cref.key not in data:
            raise RefError(f"spec.configRef.{key}: ConfigMap {cref.name!r} with key {cref.key!r} not found")
        try:
            config[key] = json.loads(data[cref.key]) if cref.json_ else data[cref.key]
        except ValueError:
            raise RefError(f"spec.configRef.{key}.json: ConfigMap {cref.name!r} key {cref.key!r} is not JSON") from None
    secret_config = dict(spec.secrets)
    redactor.add(*secret_config.values())
    for key, ref in sorted(spec.secrets_ref.items()):
        if mount_secrets and ref.type != "Literal":
            mounted_config[key] = _mounted_ref(ref)
            secret_config.pop(key, None)
            continue
        secret_config[key] = await resolve_ref(f"spec.secretsRef.{key}", ref, namespace, read_secret,
                                               allow_operator_refs)
        redactor.add(secret_config[key])
    git = await _git_credentials(spec, namespace, read_secret, allow_operator_refs) if spec.project_repo else None
    return Resolved(env, config, secret_config, git, frozenset(secret_env),
                    MountedRefs(mounted_env, tuple(env_from), mounted_config))
