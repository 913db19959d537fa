"""Which watch events wake a Stack's daemon: changes that can call for a run, not its own status writes."""

from strata_operator.controllers.context import Registry, Watched, intent


def _stack(generation=1, annotations=None, status=None):
    return {"metadata": {"namespace": "ns", "name": "s", "generation": generation, "annotations": annotations or {}},
            "status": status or {}}


def test_status_writes_do_not_wake_spec_and_requests_do():
    registry = Registry()
    watched = registry.stacks.setdefault(("ns", "s"), Watched())
    watched.seen = intent(_stack())
    registry.wake("ns", "s", _stack(status={"conditions": [{"type": "Ready", "status": "True"}]}))
    assert not watched.wakeup.is_set()
    for changed in (_stack(generation=2), _stack(annotations={"pulumi.com/reconciliation-request": "now"}),
                    _stack(annotations={"reconcile.fluxcd.io/requestedAt": "2026-11-23T04:00:00Z"})):
        watched.wakeup.clear()
        registry.wake("ns", "s", changed)
        assert watched.wakeup.is_set()


def test_unrelated_annotations_do_not_wake():
    registry = Registry()
    watched = registry.stacks.setdefault(("ns", "s"), Watched())
    watched.seen = intent(_stack())
    registry.wake("ns", "s", _stack(annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}"}))
    assert not watched.wakeup.is_set()


def test_no_more_passes_in_flight_than_the_gate_allows(monkeypatch):
    """Ten new Stacks, room for two passes: the others wait their turn, and each still gets its pass."""
    import asyncio
    import types

    from strata_operator.controllers import stack as stack_controller

    running, peak, passes = [0], [0], []

    class Stopped:
        def __init__(self) -> None:
            self.flag = False

        def __bool__(self) -> bool:
            return self.flag

    async def reconcile(ctx, body, logger):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.01)
        running[0] -= 1
        passes.append(body["name"])
        body["stopped"].flag = True
        return 0.0

    monkeypatch.setattr(stack_controller, "reconcile_stack", reconcile)

    async def fleet() -> None:
        ctx = types.SimpleNamespace(registry=Registry(), passes=asyncio.Semaphore(2))
        memo = types.SimpleNamespace(ctx=ctx)
        daemons = []
        for index in range(10):
            stopped = Stopped()
            daemons.append(stack_controller.stack_daemon(namespace="ns", name=f"s{index}", memo=memo, logger=None,
                                                         body={"name": f"s{index}", "stopped": stopped},
                                                         stopped=stopped))
        await asyncio.gather(*daemons)

    asyncio.run(fleet())
    assert peak[0] == 2 and sorted(passes) == sorted(f"s{index}" for index in range(10))
