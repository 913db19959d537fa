"""An update killed for its container's memory limit says so: the cgroup's OOM kills read around the run,
the limit and the field that raises it named, in the workspace pod's agent and the in-cluster operator."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from strata_operator.api.status import OUT_OF_MEMORY
from strata_operator.engine.pod.agent import agent_engine_settings
from strata_operator.engine.port import UpdateResult
from strata_operator.engine.process.memory_limit import (ContainerMemory, cgroup_memory_limit, cgroup_oom_kills,
                                                         oom_killed_limit)
from strata_operator.main import operator_container_memory

V1_OOM_CONTROL = "memory/memory.oom_control"


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("files", [
    {"memory.events": "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n", "memory.max": "268435456\n"},  # cgroup v2
    {V1_OOM_CONTROL: "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
     "memory/memory.limit_in_bytes": "268435456\n"},  # cgroup v1
])
def test_the_cgroups_oom_kills_and_memory_limit_are_read_on_v1_and_v2(tmp_path, files):
    _cgroup(tmp_path, files)
    assert cgroup_oom_kills(tmp_path) == 2 and cgroup_memory_limit(tmp_path) == 256 << 20


def test_no_cgroup_files_or_no_limit_read_as_unknown(tmp_path):
    assert cgroup_oom_kills(tmp_path) is None and cgroup_memory_limit(tmp_path) is None
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(tmp_path) is None


def _kills(root: Path, count: int) -> None:
    _cgroup(root, {V1_OOM_CONTROL: f"oom_kill_disable 0\nunder_oom 0\noom_kill {count}\n",
                   "memory/memory.limit_in_bytes": f"{512 << 20}\n"})


def test_a_failure_while_the_kernel_killed_in_the_container_is_out_of_memory_naming_limit_and_field(tmp_path):
    _kills(tmp_path, 1)
    memory = ContainerMemory("the operator's container", "the Operator component's resources", tmp_path)
    before = memory.oom_kills()
    _kills(tmp_path, 2)
    failed = UpdateResult("failed", "error: the language host exited", lock_left=True)
    judged = memory.judged("up", failed, before)
    assert judged.reason == OUT_OF_MEMORY and judged.lock_left
    assert judged.message == (
        "the operator's container ran out of memory: the kernel killed a process of the up at its memory limit "
        "of 512 MiB; raise the Operator component's resources.limits.memory (error: the language host exited)")


def test_a_success_or_a_failure_with_no_kill_in_the_container_is_left_as_it_is(tmp_path):
    _kills(tmp_path, 3)
    memory = ContainerMemory("the workspace pod", "spec.workspaceTemplate.spec.resources", tmp_path)
    failed, succeeded = UpdateResult("failed", "error: boom"), UpdateResult("succeeded", "")
    assert memory.judged("up", failed, memory.oom_kills()) is failed
    _kills(tmp_path, 4)  # another run's kill, after this one succeeded: not this run's doing
    assert memory.judged("up", succeeded, 3) is succeeded


def test_the_operator_watches_its_memory_only_in_the_container_the_operator_component_deploys():
    assert operator_container_memory({}) is None  # on a host the cgroup read would be the machine's
    in_pod = operator_container_memory({"STRATA_RESOURCES_FIELD": "the Operator component's resources"})
    assert in_pod == ContainerMemory("the operator's container", "the Operator component's resources")


def test_the_agent_names_its_workspace_pod_and_the_field_the_operator_set(tmp_path):
    stack = agent_engine_settings({"STRATA_RESOURCES_FIELD": "spec.workspaceTemplate.spec.resources"}, tmp_path)
    workspace = agent_engine_settings({"STRATA_RESOURCES_FIELD": "spec.resources"}, tmp_path)
    assert stack.container_memory == ContainerMemory("the workspace pod", "spec.workspaceTemplate.spec.resources")
    assert workspace.container_memory.resources_field == "spec.resources"


def _operator_pod(state: dict, last_state: dict, limit: str | None = "1Gi") -> dict:
    resources = {"limits": {"memory": limit}} if limit else {}
    return {"spec": {"containers": [{"name": "operator", "resources": resources}]},
            "status": {"containerStatuses": [{"name": "operator", "state": state, "lastState": last_state}]}}


OOM_KILLED_AT_10_00_05 = {"terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-11-29T10:00:05Z"}}
RUN_STARTED = datetime(2026, 11, 29, 10, 0, 4, 700000, tzinfo=timezone.utc)


def test_an_operator_pod_whose_container_was_oom_killed_since_the_run_started_says_its_limit():
    restarted = _operator_pod({"running": {"startedAt": "2026-11-29T10:00:06Z"}}, OOM_KILLED_AT_10_00_05)
    assert oom_killed_limit(restarted, RUN_STARTED) == "1Gi"
    waiting = _operator_pod(OOM_KILLED_AT_10_00_05, {})  # not yet restarted (the kubelet's backoff)
    assert oom_killed_limit(waiting, RUN_STARTED) == "1Gi"
    # The same second as the run's start: the kubelet's times are whole seconds.
    assert oom_killed_limit(restarted, RUN_STARTED.replace(second=5)) == "1Gi"
    assert oom_killed_limit(_operator_pod(OOM_KILLED_AT_10_00_05, {}, limit=None), RUN_STARTED) == ""


def test_an_oom_kill_before_the_run_or_another_ending_is_not_the_runs():
    assert oom_killed_limit(_operator_pod({"running": {}}, OOM_KILLED_AT_10_00_05), RUN_STARTED.replace(minute=1)) is None
    error = {"terminated": {"reason": "Error", "exitCode": 1, "finishedAt": "2026-11-29T10:00:05Z"}}
    assert oom_killed_limit(_operator_pod({"running": {}}, error), RUN_STARTED) is None
    assert oom_killed_limit({"spec": {}, "status": {}}, RUN_STARTED) is None
