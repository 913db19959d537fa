"""`make up`'s progress lines say why a Stack is still Pending when the cause is the operator, read from
its process record and its leader Lease as devstack's watch does: crashed (its last log line), or standing
by while another holds the Lease; within 30 s of it happening (issue #29: Pending with no reason for 20 min)."""

from __future__ import annotations

import os
import signal
import time

from strata_components.local import processes, stackwatch
from strata_components.local.devstack import operator_blocker

from .conftest import stash_program
from .test_leader_election import USURPER, _wait_holder, usurper  # noqa: F401 - the fixture

WITHIN = 30.0


def _said(reader, blocker, text: str, lines: list[str]) -> str:
    """Watch the test's Stacks as `make up` does until a line says `text`; that line."""
    stackwatch.watch(reader.list, stackwatch.ready_verdict, timeout=WITHIN, say=lines.append, blocker=blocker,
                     stop=lambda: any(text in line for line in lines))
    found = [line for line in lines if text in line]
    assert found, f"no line said {text!r} in {WITHIN:.0f} s: {lines}"
    return found[-1]


def test_a_pending_stack_says_the_operator_crashed_or_stands_by(stacks, operator, usurper, platform,  # noqa: F811
                                                                 kube_client):
    reader = stackwatch.StackReader(platform.kubeconfig_path, stacks.namespace)
    blocker = operator_blocker(platform.state, reader)
    try:
        _wait_holder(kube_client, operator, 60, "the session's operator leads")
        assert blocker() == ""  # it leads: nothing to say

        pid = operator.pid()
        for victim in [pid, *processes.descendants(pid)]:  # a crash: nobody stopped it, its record stays
            os.kill(victim, signal.SIGKILL)
        processes.wait_until(lambda: operator.pid() is None, 10, "the operator gone")
        crashed = time.monotonic()
        stacks.program("waiting", stash_program(a="1"))
        stacks.create("waiting", stacks.spec(programRef={"name": "waiting"}))
        lines: list[str] = []
        line = _said(reader, blocker, "Pending: the operator is not running", lines)
        assert time.monotonic() - crashed < WITHIN
        assert line.startswith(f"  {stacks.namespace}/waiting: Pending: the operator is not running")
        assert f"(log: {operator.log}; `make up` starts it again)" in line

        usurper.take()
        operator.start()  # restarted, it stands by while another holds the Lease
        line = _said(reader, blocker, "is standing by", lines)
        assert (f"the operator (pid {operator.pid()}) is standing by: the Lease strata-system/strata-operator-leader "
                f"is held by {USURPER}") in line
        usurper.release()
        stacks.wait_ready("waiting", 120)
        assert blocker() == ""
    finally:
        reader.close()
