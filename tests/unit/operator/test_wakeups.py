"""Which watch events wake a Stack's daemon: changes that can call for a run, not its own status writes."""

from strata_operator.handlers import Registry, Watched, intent


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
