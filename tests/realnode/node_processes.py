"""The real node's containers are this host's processes, each in its pod's cgroup: tests reach into them
(freeze one, change how the kernel's OOM killer ranks it) as the kernel would act on them."""

from __future__ import annotations

import contextlib
from pathlib import Path


def pod_process(pod_uid: str, module: str) -> int:
    """The process of pod `pod_uid` running `python -m <module>` (its cgroup is named by the pod's uid, with
    dashes or, under systemd, underscores)."""
    marks = (pod_uid, pod_uid.replace("-", "_"))
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if (any(mark in (proc / "cgroup").read_text() for mark in marks)
                    and f"-m\0{module}\0".encode() in (proc / "cmdline").read_bytes()):
                return int(proc.name)
    raise AssertionError(f"no process of `python -m {module}` in pod {pod_uid}")
