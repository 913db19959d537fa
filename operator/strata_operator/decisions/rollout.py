"""Progressive rollout of a Program to the Stacks that use it, wave by wave (pure).

A Program with `rollout.waves` releases each new revision to its Stacks in order: a wave is the Stacks
its label `selector` matches, or the next `count` Stacks by name, among those no earlier wave took;
Stacks left over form a last wave. A Stack runs a revision only once every Stack of the waves before
its own has run that revision successfully; once one of them failed it, the rollout halts there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..api.status import FAILED, SUCCEEDED, Verdict

ROLLOUT_WAITING = "RolloutWaiting"
ROLLOUT_HALTED = "RolloutHalted"


@dataclasses.dataclass(frozen=True)
class Wave:
    selector: Mapping[str, Any] | None = None
    count: int | None = None


@dataclasses.dataclass(frozen=True)
class RolloutStack:
    """A Stack using the Program: its labels, and what its last update did."""

    name: str
    labels: Mapping[str, str]
    last: Mapping[str, Any]

    def succeeded(self, revision: str) -> bool:
        return self.last.get("state") == SUCCEEDED and self.last.get("lastSuccessfulCommit") == revision

    def failed(self, revision: str) -> bool:
        return self.last.get("state") == FAILED and self.last.get("lastAttemptedCommit") == revision


def parse_waves(program: Mapping[str, Any]) -> list[Wave] | None:
    """The Program's waves, or None when it has no rollout (every Stack runs a new revision at once)."""
    waves = ((program.get("rollout") or {}).get("waves")) or None
    return [Wave(w.get("selector"), w.get("count")) for w in waves] if waves else None


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against an object's labels."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def assign_waves(waves: Sequence[Wave], stacks: Sequence[RolloutStack]) -> dict[str, int]:
    """Each Stack's wave index; Stacks no wave takes are in the last one (index len(waves))."""
    assigned: dict[str, int] = {}
    remaining = sorted(stacks, key=lambda s: s.name)
    for index, wave in enumerate(waves):
        if wave.selector is not None:
            taken = [s for s in remaining if selector_matches(wave.selector, s.labels)]
        else:
            taken = remaining[:wave.count or 0]
        for stack in taken:
            assigned[stack.name] = index
        remaining = [s for s in remaining if s.name not in assigned]
    for stack in remaining:
        assigned[stack.name] = len(waves)
    return assigned


def rollout_gate(waves: Sequence[Wave], stacks: Sequence[RolloutStack], me: str, revision: str) -> Verdict | None:
    """None when Stack `me` may run `revision` now; else why it waits (earlier waves still running) or
    why the rollout halted (a Stack of an earlier wave failed it)."""
    assigned = assign_waves(waves, stacks)
    mine = assigned.get(me, len(waves))
    total = max(assigned.values(), default=0) + 1
    earlier = sorted((s for s in stacks if assigned[s.name] < mine), key=lambda s: (assigned[s.name], s.name))
    failed = [s for s in earlier if s.failed(revision)]
    if failed:
        first = failed[0]
        return Verdict("reconciling", ROLLOUT_HALTED,
                       f"rollout of {revision} halted: Stack {first.name} of wave {assigned[first.name] + 1} failed it"
                       f" ({first.last.get('message', '')}); this Stack (wave {mine + 1}) runs it once that one "
                       "succeeds (fix the Program, or the failing Stack)")
    pending = [s.name for s in earlier if not s.succeeded(revision)]
    if pending:
        shown = ", ".join(pending[:5]) + (f" and {len(pending) - 5} more" if len(pending) > 5 else "")
        return Verdict("reconciling", ROLLOUT_WAITING,
                       f"wave {mine + 1} of {total}: waiting for {len(pending)} Stack(s) of earlier waves to run "
                       f"{revision} ({shown})")
    return None


def rollout_progress(waves: Sequence[Wave], stacks: Sequence[RolloutStack], revision: str) -> dict[str, Any]:
    """The Program's `status.rollout`: per wave how many Stacks ran the revision, which failed it, which
    wave is running and whether the rollout halted or is complete."""
    assigned = assign_waves(waves, stacks)
    rows = []
    for index in range(max(assigned.values(), default=-1) + 1):
        members = [s for s in stacks if assigned[s.name] == index]
        rows.append({"stacks": len(members), "succeeded": sum(s.succeeded(revision) for s in members),
                     "failed": sorted(s.name for s in members if s.failed(revision))})
    progress: dict[str, Any] = {"revision": revision, "waves": rows}
    current = next((index for index, row in enumerate(rows) if row["succeeded"] < row["stacks"]), None)
    progress["complete"] = current is None
    if current is not None:
        progress["currentWave"] = current + 1
        if rows[current]["failed"]:
            progress["halted"] = (f"wave {current + 1}: {', '.join(rows[current]['failed'])} failed {revision}; "
                                  "later waves wait")
    return progress
