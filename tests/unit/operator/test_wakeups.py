"""Which watch events wake a Stack's daemon: changes that can call for a run, not its own status writes."""

import asyncio
import importlib

import kopf

from strata_operator.controllers.context import Registry, Watched, intent
from strata_operator.main import HANDLER_MODULES


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


def _fleet_passes(monkeypatch, stacks: list[tuple[str, str]], room: int) -> tuple[int, list[str]]:
    """Daemons of `stacks` ((namespace, name), started in that order), each doing one pass, with room for
    `room` passes at once: the most passes that ran at once, and the Stacks in the order their passes ended."""
    import types

    from strata_operator.controllers import stack as stack_controller
    from strata_operator.services.fair_slots import FairSlots

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
        ctx = types.SimpleNamespace(registry=Registry(), passes=FairSlots(room))
        memo = types.SimpleNamespace(ctx=ctx)
        daemons = []
        for namespace, name in stacks:
            stopped = Stopped()
            daemons.append(stack_controller.stack_daemon(namespace=namespace, name=name, memo=memo, logger=None,
                                                         body={"name": name, "stopped": stopped},
                                                         stopped=stopped))
        await asyncio.gather(*daemons)

    asyncio.run(fleet())
    return peak[0], passes


def test_no_more_passes_in_flight_than_the_gate_allows(monkeypatch):
    """Ten new Stacks, room for two passes: the others wait their turn, and each still gets its pass."""
    peak, passes = _fleet_passes(monkeypatch, [("ns", f"s{index}") for index in range(10)], room=2)
    assert peak == 2 and sorted(passes) == sorted(f"s{index}" for index in range(10))


def test_a_namespace_with_many_stacks_does_not_keep_another_namespaces_stack_from_its_pass(monkeypatch):
    """Team a's ten Stacks came first and take both passes; team b's one still has the next pass freed, not
    the eleventh (a pass holds its room while its run waits for the engine: minutes behind a's)."""
    peak, passes = _fleet_passes(monkeypatch, [*(("a", f"a{index}") for index in range(10)), ("b", "b0")], room=2)
    assert peak == 2 and passes.index("b0") == 2, passes


def test_every_resource_handler_runs_on_the_event_loop():
    """Kopf runs a plain-function handler on a thread: there, waking Stacks iterated the registry while the
    daemons added and removed entries ("dictionary changed size during iteration" in a 200-Stack run, the
    event's wake-ups lost) and set asyncio Events from outside their loop."""
    for module in HANDLER_MODULES:
        importlib.import_module(f"strata_operator.{module}")
    registry = kopf.get_default_registry()
    handlers = [*registry._watching.get_all_handlers(), *registry._changing.get_all_handlers(),
                *registry._spawning.get_all_handlers()]
    assert {handler.id for handler in handlers} >= {"stack_changed", "program_changed", "flux-gitrepositories"}
    on_threads = [handler.id for handler in handlers if not asyncio.iscoroutinefunction(handler.fn)]
    assert on_threads == []
