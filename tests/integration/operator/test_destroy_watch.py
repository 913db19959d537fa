"""`make down`'s watch of the Stacks it deletes, against the real operator: a Stack whose destroy fails
(its program can no longer load) stops the watch within a bounded time, named with its reason; the
forced path removes its finalizer and says what its state still holds."""

from __future__ import annotations

import time

from .conftest import has_condition, stash_project, unique

from strata_components.local import devstack
from strata_components.local.stackwatch import StackReader


def test_a_stack_whose_destroy_fails_stops_the_watch_then_force_releases_it(stacks, local_platform):
    name = unique("undestroyable")
    url = local_platform.git.create(name, {"Pulumi.yaml": stash_project("undestroyable", kept="value")})
    stacks.create(name, stacks.spec(projectRepo=url, branch="main", destroyOnFinalize=True))
    stacks.wait_ready(name)
    # The program can no longer load: every engine run of it fails, the destroy included.
    local_platform.git.commit(name, {"Pulumi.yaml": "name: undestroyable\nruntime: [not, a, runtime\n"})
    stacks.wait(name, lambda o: (o["status"].get("lastUpdate") or {}).get("state") == "failed", 60,
                "the update of the broken program failed")
    stacks.delete(name)

    said: list[str] = []
    reader = StackReader(local_platform.kubeconfig_path, namespace=stacks.namespace)
    try:
        started = time.monotonic()
        blocked = devstack.watch_deletions(reader, force=False, stuck_after=15, say=said.append,
                                           stop=lambda: time.monotonic() - started > 240)
        elapsed = time.monotonic() - started
        assert [state.key for state in blocked] == [f"{stacks.namespace}/{name}"], said
        assert elapsed < 120, f"the watch took {elapsed:.0f}s to give up"
        assert blocked[0].reason == "RetryingAfterFailure" and "destroy failed" in blocked[0].message
        assert any(f"{stacks.namespace}/{name}: Deleting" in line for line in said)
        # Still there, finalizer and all: nothing was forced.
        assert stacks.get(name) is not None

        forced = devstack.watch_deletions(reader, force=True, stuck_after=15, say=said.append,
                                          stop=lambda: stacks.get(name) is None)
        assert forced == []
        assert stacks.get(name) is None
        released = [line for line in said if line.strip().startswith("forced:")]
        assert len(released) == 1 and name in released[0]
        # What it leaves behind is read from its state, which the failed destroy kept.
        assert "its stack dev still holds 1 pulumi:index:Stash" in released[0]
    finally:
        reader.close()
    assert not has_condition(stacks.get(name), "Ready")
