"""Running out of memory inside a container with a limit of its own (the in-cluster operator, a workspace
pod's agent): the kernel's OOM killer kills a process of the update (most often its language host) and
the update fails with whatever that process's death looked like. The executor reads its memory cgroup's
OOM kills around each operation, so such a failure says what happened, at which limit, and the field
that raises it. On a host the cgroup read is the machine's root: nothing is read there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from ...api.status import OUT_OF_MEMORY, parse_time
from ..port import Operation, UpdateResult

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_oom_kills(root: Path) -> int | None:
    """How many processes the kernel's OOM killer has killed in this container's memory cgroup (v2's
    memory.events, v1's memory.oom_control); None where neither is readable."""
    for path in (root / "memory.events", root / "memory" / "memory.oom_control"):
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def cgroup_memory_limit(root: Path) -> int | None:
    """The container's memory limit in bytes (None: unlimited or unknown)."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        return int(text) if text.isdigit() and int(text) < 1 << 60 else None
    return None


@dataclasses.dataclass(frozen=True)
class ContainerMemory:
    """The container an executor runs in, as its messages name it."""

    container: str  # e.g. "the workspace pod", "the operator's container"
    resources_field: str  # where the container's resources are set, e.g. spec.workspaceTemplate.spec.resources
    cgroup_root: Path = CGROUP_ROOT

    def oom_kills(self) -> int:
        return cgroup_oom_kills(self.cgroup_root) or 0

    def judged(self, operation: Operation, result: UpdateResult, oom_kills_before: int) -> UpdateResult:
        """`result`, or, if it failed while the kernel killed a process in the container for its memory
        limit, an OutOfMemory result that says so. A CLI killed that way left its lock: the worker's
        `lock_left` already has it cleared before the Stack's next operation."""
        if result.ok or self.oom_kills() <= oom_kills_before:
            return result
        limit = cgroup_memory_limit(self.cgroup_root)
        message = (f"{self.container} ran out of memory: the kernel killed a process of the {operation} at its "
                   f"memory limit{f' of {limit // (1 << 20)} MiB' if limit else ''}; raise "
                   f"{self.resources_field}.limits.memory ({result.message})")
        return dataclasses.replace(result, message=message, reason=OUT_OF_MEMORY)

    def killed_whole(self, pod: Mapping[str, Any], since: datetime,
                     during: str = "most likely for this update") -> str | None:
        """What ended a run that started at `since` in `pod` (this container's), if the kubelet reports the
        container OOMKilled since then; None otherwise. `during`: what the container was doing for the run."""
        limit = oom_killed_limit(pod, since)
        if limit is None:
            return None
        return (f"the kernel killed {self.container} (pod {pod['metadata']['name']}) for out of memory"
                f"{f' at its memory limit of {limit}' if limit else ''}, {during}; raise "
                f"{self.resources_field}.limits.memory")


def oom_killed_limit(pod: Mapping[str, Any], since: datetime) -> str | None:
    """The memory limit (e.g. "1Gi", "" if it had none) of the pod's container that the kubelet reports
    OOMKilled at or after `since`, as its current or last state; None if none was. On cgroup v2 nodes the
    kernel kills a container whole at its limit, its main process (the operator) too."""
    limits = {container.get("name"): ((container.get("resources") or {}).get("limits") or {}).get("memory", "")
              for container in (pod.get("spec") or {}).get("containers") or []}
    since = since.replace(microsecond=0)  # the kubelet's times are whole seconds
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (status.get("state"), status.get("lastState")):
            terminated = (state or {}).get("terminated") or {}
            finished = parse_time(terminated.get("finishedAt"))
            if terminated.get("reason") == "OOMKilled" and finished is not None and finished >= since:
                return str(limits.get(status.get("name"), ""))
    return None

