"""What a workspace pod resolves from its own environment and files, which the operator never reads:
a PKO v2 Workspace stack's config items (`spec.stacks[].config`, `valueFrom.env`) and a Stack's
references left to the pod (`MountedRefs`).

Pure and light (no pydantic, no Kubernetes client): the workspace agent imports it. The secret values
`config_values` returns are the caller's to register with the redactor.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

_PATH_PART = re.compile(r'\[(\d+)\]|\["((?:[^"\\]|\\.)*)"\]|\.?([^.\[\]]+)')


class ConfigUnavailable(Exception):
    """A config item's value cannot be had (a variable missing from the environment, bad JSON or path)."""


@dataclasses.dataclass(frozen=True)
class ConfigItem:
    key: str
    field: str  # where it is in the spec, for messages
    value: Any = None
    path: bool = False
    from_env: str = ""
    json: bool = False
    secret: bool = False

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "ConfigItem":
        return cls(**{f.name: body[f.name] for f in dataclasses.fields(cls) if f.name in body})


def parse_config_path(key: str) -> list[str | int]:
    """Pulumi's config path syntax (`pulumi config set --path`): `a.b[0]`, `a["b.c"]`; the first part is the
    config key itself (namespace included: `aws:tags.Name` -> ["aws:tags", "Name"])."""
    parts: list[str | int] = []
    position = 0
    while position < len(key):
        found = _PATH_PART.match(key, position)
        if found is None or found.end() == position:
            raise ValueError(f"cannot parse the config path {key!r}")
        index, quoted, plain = found.groups()
        parts.append(int(index) if index is not None else
                     quoted.replace('\\"', '"') if quoted is not None else plain)
        position = found.end()
    if not parts or not isinstance(parts[0], str):
        raise ValueError(f"the config path {key!r} does not start with a key")
    return parts


def _path_value(text: Any) -> Any:
    """As `pulumi config set --path` stores a string inside an object: true/false and integers typed."""
    if text in ("true", "false"):
        return text == "true"
    if isinstance(text, str) and re.fullmatch(r"-?(0|[1-9][0-9]*)", text):
        return int(text)
    return text


def _set_path(config: dict[str, Any], parts: list[str | int], value: Any) -> None:
    node: Any = config
    for here, after in zip(parts, parts[1:]):
        empty: Any = [] if isinstance(after, int) else {}
        if isinstance(node, list):
            assert isinstance(here, int)
            node.extend([None] * (here + 1 - len(node)))
            if not isinstance(node[here], (dict, list)):
                node[here] = empty
        elif not isinstance(node.get(here), (dict, list)):
            node[here] = empty
        node = node[here]
    last = parts[-1]
    if isinstance(node, list):
        if not isinstance(last, int):
            raise ValueError(f"{last!r} indexes a list")
        node.extend([None] * (last + 1 - len(node)))
    node[last] = value


def config_values(items: Iterable[ConfigItem], env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(config, secret config) from a stack's items, valueFrom.env read from `env` (the workspace's
    environment: the operator's reading of it, or the pod's own); ConfigUnavailable names the item."""
    config: dict[str, Any] = {}
    secrets: dict[str, str] = {}
    for item in items:
        value = item.value
        if item.from_env:
            if item.from_env not in env:
                raise ConfigUnavailable(f"{item.field}.valueFrom.env: missing value for environment variable: {item.from_env}")
            value = env[item.from_env]
            if item.json:
                try:
                    value = json.loads(value)
                except ValueError:
                    raise ConfigUnavailable(f"{item.field}.valueFrom.json: the variable {item.from_env} is not JSON") from None
        if item.secret:
            secrets[item.key] = value if isinstance(value, str) else json.dumps(value)
        elif item.path:
            try:
                _set_path(config, parse_config_path(item.key), _path_value(value))
            except ValueError as err:
                raise ConfigUnavailable(f"{item.field}.key: {err}") from None
        else:
            config[item.key] = value
    return config, secrets


@dataclasses.dataclass(frozen=True)
class MountedRefs:
    """A Stack's references the workspace pod resolves itself (the pod executor): each ref is
    {"secret": {"name", "key"}} (a Secret key, given to the pod by the kubelet), {"env": NAME} (the
    workspace's own environment, PKO v2's Env refs) or {"file": PATH} (a file in the workspace)."""

    env: Mapping[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    env_from: tuple[str, ...] = ()  # whole Secrets (spec.envSecrets)
    secret_config: Mapping[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"env": dict(self.env), "env_from": list(self.env_from), "secret_config": dict(self.secret_config)}

    @classmethod
    def from_json(cls, body: Mapping[str, Any] | None) -> "MountedRefs":
        body = body or {}
        return cls(dict(body.get("env") or {}), tuple(body.get("env_from") or ()), dict(body.get("secret_config") or {}))

    def __bool__(self) -> bool:
        return bool(self.env or self.env_from or self.secret_config)
