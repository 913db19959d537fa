"""What every API's validation shares: an issue names its field path and the fix, and the Stalled
reason it stands for; Go durations; pydantic's errors turned into such issues."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

_GO_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+$")


_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class ApiModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


STALLED_SPEC_INVALID = "SpecInvalid"
# A workspace pod template asks for what a team may not have (workspace_template.py).
STALLED_TEMPLATE_FORBIDDEN = "WorkspaceTemplateForbidden"


@dataclasses.dataclass(frozen=True)
class SpecIssue:
    path: str
    problem: str
    fix: str
    reason: str = STALLED_SPEC_INVALID

    def __str__(self) -> str:
        return f"{self.path}: {self.problem} (fix: {self.fix})"


class SpecInvalid(Exception):
    """The spec cannot be processed as written; every issue names its field and the fix."""

    def __init__(self, issues: list[SpecIssue]):
        self.issues = issues
        super().__init__("; ".join(str(i) for i in issues))

    @property
    def fields(self) -> list[str]:
        return [i.path for i in self.issues]

    @property
    def reason(self) -> str:
        """The Stalled reason: a specific one when an issue has it (PKO's for cross-namespace refs, a forbidden
        workspace template), else SpecInvalid."""
        return next((i.reason for i in self.issues if i.reason != STALLED_SPEC_INVALID), STALLED_SPEC_INVALID)


def parse_duration(text: str) -> float:
    """A Go `time.Duration` string ("90s", "1h30m", or "0" as Go allows) in seconds; ValueError if malformed."""
    if text == "0":
        return 0.0
    if not _GO_DURATION.match(text):
        raise ValueError(text)
    return sum(float(n) * _DURATION_UNITS[u] for n, u in _GO_DURATION_PART.findall(text))


def _json_path(root: str, loc: tuple[Any, ...]) -> str:
    """Pydantic locations (aliases, list indexes) as a JSON path such as spec.prerequisites[0].name."""
    parts = [root]
    for item in loc:
        if isinstance(item, int):
            parts[-1] += f"[{item}]"
        else:
            parts.append(str(item))
    return ".".join(parts)


_PYDANTIC_FIXES = {
    "missing": "set this required field",
    "extra_forbidden": "remove this field; it is not part of the Stack API (check its spelling)",
    "literal_error": "use one of the allowed values",
    "bool_type": "use true or false",
    "bool_parsing": "use true or false",
    "int_type": "use a whole number",
    "int_parsing": "use a whole number",
    "string_type": "use a string",
    "dict_type": "use a map of key: value",
    "list_type": "use a list",
    "model_type": "use an object with the documented fields",
}


def pydantic_issues(err: ValidationError, root: str = "spec") -> list[SpecIssue]:
    """Each of pydantic's errors as an issue at its JSON path under `root`, with the fix for its kind."""
    issues = []
    for e in err.errors(include_url=False, include_input=False):
        path = _json_path(root, e["loc"])
        issues.append(SpecIssue(path, e["msg"], _PYDANTIC_FIXES.get(e["type"], "correct the value")))
    return issues
