"""spec.driftDetection on the real operator and engine, with real out-of-band drift: two Stacks read a
third's output through a StackReference, and that Stack then changes outside them. The one that only
detects reports Drifted (still Ready, nothing run); the one that remediates runs an update that brings
its state back and clears the condition."""

import urllib.request

from .conftest import condition, eventually_constant, has_condition, stash_program


def _reader(producer_project: str, producer_stack: str) -> dict:
    """A Program whose only resource is a StackReference: its state holds the producer's outputs as read."""
    return {"resources": {"ref": {"type": "pulumi:pulumi:StackReference",
                                  "properties": {"name": f"organization/{producer_project}/{producer_stack}"}}},
            "outputs": {"seen": '${ref.outputs["value"]}'}}


def _drifted(stack) -> bool:
    return has_condition(stack, "Drifted")


def test_drift_from_outside_is_reported_and_remediated_when_asked(stacks, operator):
    stacks.program("producer", stash_program(value="one"))
    stacks.create("producer", stacks.spec(stack="producer", programRef={"name": "producer"}))
    stacks.wait_ready("producer", 90)
    stacks.program("reader", _reader("producer", "producer"))
    stacks.create("watcher", stacks.spec(stack="watcher", programRef={"name": "reader"},
                                         driftDetection={"interval": "3s"}))
    stacks.create("fixer", stacks.spec(stack="fixer", programRef={"name": "reader"},
                                       driftDetection={"interval": "3s", "remediate": True}))
    for name in ("watcher", "fixer"):
        assert stacks.wait_ready(name, 90)["status"]["outputs"]["seen"] == "one"
    # Checks that find nothing report so, and run no update.
    clean = stacks.wait("watcher", lambda o: (o["status"].get("drift") or {}).get("checkedAt"), 30, "a drift check")
    assert clean["status"]["drift"]["drifted"] is False and not _drifted(clean)
    runs = {name: stacks.runs(name) for name in ("watcher", "fixer")}

    # The change outside: the producer's output moves on; both readers' states still hold "one".
    stacks.replace_program("producer", stash_program(value="two"))
    stacks.wait("producer", lambda o: (o["status"].get("outputs") or {}).get("value") == "two", 90, "value two")

    watcher = stacks.wait("watcher", _drifted, 60, "Drifted=True")
    assert has_condition(watcher, "Ready"), "a drifted Stack is still healthy: Ready, neither Reconciling nor Stalled"
    assert condition(watcher, "Reconciling") is None and condition(watcher, "Stalled") is None
    assert watcher["status"]["drift"]["drifted"] is True and watcher["status"]["drift"]["changes"] == {"update": 1}
    assert "update 1 outside Pulumi" in condition(watcher, "Drifted")["message"]
    assert "update 1 outside Pulumi" in stacks.wait_events("watcher", "DriftDetected")[0].message
    metrics = urllib.request.urlopen(operator.metrics_url, timeout=10).read().decode()
    assert f'stacks_drifted{{name="watcher",namespace="{stacks.namespace}"}} 1.0' in metrics
    eventually_constant(lambda: stacks.runs("watcher"), 5)
    assert stacks.runs("watcher") == runs["watcher"], "detection alone runs no update"
    assert stacks.get("watcher")["status"]["outputs"]["seen"] == "one"

    fixer = stacks.wait("fixer", lambda o: (o["status"].get("outputs") or {}).get("seen") == "two" and
                        has_condition(o, "Ready"), 90, "remediated to two")
    assert stacks.wait_events("fixer", "DriftDetected") and stacks.runs("fixer") == runs["fixer"] + 1
    assert not _drifted(fixer) and fixer["status"]["drift"]["drifted"] is False
