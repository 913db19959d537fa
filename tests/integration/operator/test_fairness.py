"""One team stops nobody (issue #45, fairness): team A fills an operator of two run slots with slow Stacks and
pushes sources above its size cap; team B's one Stack still goes Ready within B_READY_WITHIN_SECONDS, while
most of A's still wait, and A's oversized sources are refused at once, naming the cap and the flag.

Each of A's updates is slow because its object store is: a link in front of the session's MinIO holds every
request that takes a stack's lock for LOCK_HELD_SECONDS (one per update), so each run of A's lasts that and
its few seconds of work. Handed out first come first served, as before, B's run slot came after all 10 of
A's runs had started: five rounds of them, over 100 s. Shared fairly, it is the first slot freed, within
one round of A's runs."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata_components import s3
from strata_components.local import processes
from strata_components.local.operator_host import operator_host
from strata_operator.api.status import parse_time
from tests.conftest import served_namespace

from .conftest import (MIN_RESYNC_SECONDS, PASSPHRASE, STALL_AFTER_FAILURES, Operator, Stacks, has_condition,
                       stash_program, stash_project, unique)
from .test_backend_outage import REQUEST_LINE, CuttableLink, writes

CONCURRENCY = 2
SLOW_STACKS = 10
LOCK_HELD_SECONDS = 20.0
# The bound: one round of A's runs (the lock held, then a few seconds of update) and B's own run.
B_READY_WITHIN_SECONDS = 60.0
MAX_SOURCE_BYTES = 1024 * 1024
OVERSIZED_REFUSED_WITHIN_SECONDS = 30


class LockWritesHeld:
    """A CuttableLink's `trip` that never cuts: it holds each request taking a stack's lock for `seconds`
    before the link passes it on, and counts them (one per update that has its run slot)."""

    def __init__(self, seconds: float):
        self.seconds, self.seen = seconds, 0
        self._lock = threading.Lock()

    def __call__(self, data: bytes) -> bool:
        line = data.split(b"\r\n", 1)[0].decode("latin-1")
        if REQUEST_LINE.match(line) and writes("locks")(line):
            with self._lock:
                self.seen += 1
            time.sleep(self.seconds)
        return False


@pytest.fixture
def fair_operator(operator: Operator, platform, toolchain, plugin_cache, tmp_path: Path) -> Iterator[Operator]:
    """The session's operator stopped; in its place one with two run slots and a 1 MiB source cap. The
    session's operator comes back afterwards."""
    operator.stop()
    host = operator_host(platform, toolchain, tmp_path / "fair", name="strata-operator-fair", extra_args=(
        "--concurrency", str(CONCURRENCY), "--max-source-bytes", str(MAX_SOURCE_BYTES),
        "--stall-after-failures", str(STALL_AFTER_FAILURES), "--min-resync-seconds", str(MIN_RESYNC_SECONDS),
        "--plugin-cache", str(plugin_cache)))
    running = Operator(**{name: getattr(host, name) for name in host.__dataclass_fields__})
    try:
        running.start()
        yield running
    finally:
        running.stop()
        operator.start()


@pytest.fixture
def team_b(fair_operator: Operator, local_platform, kube_client, tmp_path: Path) -> Iterator[Stacks]:
    """Team B's namespace, served as a team's, and its Stacks on a file:// backend of its own."""
    root = tmp_path / "team-b"
    (root / "backend").mkdir(parents=True)
    for name in served_namespace(local_platform, kube_client, unique("team-b"), root):
        stacks = Stacks(kube_client, name, (root / "backend").as_uri(), fair_operator)
        stacks.secret("pulumi", {"passphrase": PASSPHRASE})
        yield stacks


def test_one_teams_slow_and_oversized_stacks_do_not_keep_another_teams_stack_from_going_ready(
        fair_operator, stacks: Stacks, team_b: Stacks, object_store, local_platform):
    team_a = stacks
    endpoint, root = object_store
    bucket = f"fairness-{uuid.uuid4().hex[:8]}"
    s3.ensure_bucket(endpoint, bucket, root)
    host, port = endpoint.removeprefix("http://").split(":")
    lock_writes = LockWritesHeld(LOCK_HELD_SECONDS)
    link = CuttableLink((host, int(port)), lock_writes)
    link.mend()
    try:
        team_a.secret("store", {"AWS_ACCESS_KEY_ID": root.access_key_id,
                                "AWS_SECRET_ACCESS_KEY": root.secret_access_key, "passphrase": PASSPHRASE})
        team_a.program("slow", stash_program(value="slow"))
        backend = f"s3://{bucket}?endpoint=http://127.0.0.1:{link.port}&use_path_style=true&region={s3.REGION}"
        env_refs = {name: {"type": "Secret", "secret": {"name": "store", "key": key}}
                    for name, key in (("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
                                      ("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
                                      ("PULUMI_CONFIG_PASSPHRASE", "passphrase"))}
        slow = [f"slow-{index}" for index in range(SLOW_STACKS)]
        for name in slow:
            team_a.create(name, team_a.spec(stack=name, programRef={"name": "slow"}, backend=backend,
                                            envRefs=env_refs))
        # And sources above the cap: a repository whose one commit holds 2 MiB that do not compress.
        repo = f"{team_a.namespace}-big"
        url = local_platform.git.create(repo, {"Pulumi.yaml": stash_project("big", value="big"),
                                               "noise.txt": os.urandom(MAX_SOURCE_BYTES).hex()})
        oversized = ["big-0", "big-1"]
        for name in oversized:
            team_a.create(name, team_a.spec(stack=name, projectRepo=url, branch="main"))

        # Both run slots taken by A's updates (each takes its lock as it starts; the others wait for a slot).
        processes.wait_until(lambda: lock_writes.seen >= CONCURRENCY, 120, "both run slots taken by team A",
                             log=fair_operator.log, interval=0.5)

        team_b.program("app", stash_program(greeting="hello"))
        created = time.monotonic()
        team_b.create("app", team_b.spec(programRef={"name": "app"}))
        ready = team_b.wait_ready("app", timeout=B_READY_WITHIN_SECONDS)
        took = time.monotonic() - created
        a_ready = [name for name in slow if has_condition(team_a.get(name), "Ready")]
        assert ready["status"]["outputs"] == {"greeting": "hello"}
        # The premise: B's run did not come after A's queue. Most of A's slow Stacks still wait (first come
        # first served, all 10 of A's would have run first).
        assert len(a_ready) <= SLOW_STACKS // 2, (f"team B Ready after {took:.1f} s, with {len(a_ready)} of "
                                                  f"team A's slow Stacks Ready already: were A's runs slow?")

        # Refused within OVERSIZED_REFUSED_WITHIN_SECONDS of their creation (source work waits for no run slot),
        # naming the field, the cap and the flag that raises it.
        for name in oversized:
            stalled = team_a.wait_stalled(name, "SourceUnavailable", timeout=30)
            said = next(c for c in stalled["status"]["conditions"] if c["type"] == "Stalled")
            assert said["message"].startswith("spec.projectRepo: "), said
            assert "exceeds the operator's source size cap of 1 MiB" in said["message"], said
            assert "raise --max-source-bytes" in said["message"], said
            refused_after = (parse_time(said["lastTransitionTime"])
                             - parse_time(stalled["metadata"]["creationTimestamp"])).total_seconds()
            assert refused_after <= OVERSIZED_REFUSED_WITHIN_SECONDS, (name, refused_after)
            assert team_a.runs(name) == 0
    finally:
        link.cut()
