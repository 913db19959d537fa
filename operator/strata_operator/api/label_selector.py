"""Kubernetes label selectors in their string form (`kubectl -l`, Flux's `--watch-label-selector`), parsed
once and matched against an object's labels.

The grammar is apimachinery's: requirements separated by commas, each `key`, `!key`, `key=value`,
`key==value`, `key!=value`, `key in (a,b)` or `key notin (a,b)`; all must hold. As there, `!=` and
`notin` also match objects without the key.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Literal

Operator = Literal["exists", "absent", "in", "notin"]

# A qualified name with an optional DNS-subdomain prefix, and a label value: apimachinery's validation.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}")
_VALUE = re.compile(rf"({_NAME})?")
_REQUIREMENT = re.compile(
    r"\s*(?:(?P<absent>!)\s*(?P<akey>[^\s=!(),]+)"
    r"|(?P<key>[^\s=!(),]+)(?:\s*(?P<op>==|=|!=)\s*(?P<value>[^\s=!(),]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?)\s*(?:,|$)")


@dataclasses.dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "exists":
            return self.key in labels
        if self.operator == "absent":
            return self.key not in labels
        if self.operator == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values


@dataclasses.dataclass(frozen=True)
class LabelSelector:
    """All requirements must hold; the empty selector matches every object."""

    requirements: tuple[Requirement, ...] = ()
    text: str = ""

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        return all(requirement.matches(labels or {}) for requirement in self.requirements)

    @property
    def canonical(self) -> str:
        """One spelling per meaning (sorted, normalised operators): what identifies a shard."""
        parts = []
        for r in sorted(self.requirements, key=lambda r: (r.key, r.operator, sorted(r.values))):
            values = ",".join(sorted(r.values))
            parts.append({"exists": r.key, "absent": f"!{r.key}", "in": f"{r.key} in ({values})",
                          "notin": f"{r.key} notin ({values})"}[r.operator])
        return ",".join(parts)


def parse_label_selector(text: str, flag: str = "--watch-label-selector") -> LabelSelector:
    """The selector `text` says; ValueError names the requirement that is not one, and how to write it."""
    requirements: list[Requirement] = []
    position = 0
    stripped = text.strip()
    while position < len(stripped):
        match = _REQUIREMENT.match(stripped, position)
        if match is None or match.end() == position:
            rest = stripped[position:].split(",")[0].strip()
            if not rest:
                raise ValueError(f"{flag} {text!r}: an empty requirement (two commas in a row); remove one")
            raise ValueError(f"{flag} {text!r}: {rest!r} is not a label requirement; write key, !key, key=value, "
                             "key!=value, key in (a,b) or key notin (a,b), separated by commas")
        requirements.append(_requirement(match, text, flag))
        position = match.end()
    return LabelSelector(tuple(requirements), stripped)


def _requirement(match: re.Match[str], text: str, flag: str) -> Requirement:
    key = match["akey"] or match["key"]
    if not _KEY.fullmatch(key):
        raise ValueError(f"{flag} {text!r}: {key!r} is not a label key (a name of letters, digits, '-', '_', '.', "
                         "at most 63 characters, optionally prefixed by a DNS subdomain and '/')")
    if match["absent"]:
        return Requirement(key, "absent")
    if match["op"]:
        values = [match["value"]]
        operator: Operator = "notin" if match["op"] == "!=" else "in"
    elif match["setop"]:
        values = [value.strip() for value in match["values"].split(",")]
        operator = match["setop"]  # type: ignore[assignment]
        if values == [""]:
            raise ValueError(f"{flag} {text!r}: `{key} {operator} ()` names no value; list at least one")
    else:
        return Requirement(key, "exists")
    for value in values:
        if not _VALUE.fullmatch(value):
            raise ValueError(f"{flag} {text!r}: {value!r} is not a label value (at most 63 letters, digits, "
                             "'-', '_' or '.', starting and ending with a letter or digit)")
    return Requirement(key, operator, frozenset(values))
