"""Reconcile-request annotations and PKO v2 fields that do not apply, watched version by version.

A watch records every version of the Stack the apiserver stores, so a status that is wrong for only
one write (what a kstatus client such as Flux's health check or `kubectl wait` can act on) is caught
deterministically, without sleeping or timing anything.
"""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import watch

from strata_components.local import processes

from .conftest import GROUP, VERSION, condition, eventually_constant, has_condition, stash_program

FLUX_REQUEST = "reconcile.fluxcd.io/requestedAt"
PULUMI_REQUEST = "pulumi.com/reconciliation-request"


class Versions:
    """Every stored version of one Stack from now on, from a watch in a background thread."""

    def __init__(self, stacks, name: str):
        self.stacks, self.name = stacks, name
        self.objects: list[dict[str, Any]] = []
        self.error: Exception | None = None
        self._stopping = False
        listed = stacks.custom.list_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "stacks")
        self._since = listed["metadata"]["resourceVersion"]
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._record, daemon=True)

    def _record(self) -> None:
        try:
            for event in self._watch.stream(self.stacks.custom.list_namespaced_custom_object, GROUP, VERSION,
                                            self.stacks.namespace, "stacks", resource_version=self._since,
                                            field_selector=f"metadata.name={self.name}", timeout_seconds=600):
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.objects.append(event["object"])
        except Exception as error:  # noqa: BLE001 - reported by __exit__, unless stop() closed the stream
            if not self._stopping:
                self.error = error

    def __enter__(self) -> "Versions":
        self._thread.start()
        return self

    def __exit__(self, failure: Any, *exc: Any) -> None:
        try:
            if failure is None:
                # Caught up when the watch has delivered the version stored now.
                current = self.stacks.get(self.name)["metadata"]["resourceVersion"]
                processes.wait_until(lambda: self.error or any(o["metadata"]["resourceVersion"] == current
                                                               for o in self.objects),
                                     30, f"the watch on Stack {self.name} to deliver version {current}")
        finally:
            self._stopping = True
            self._watch.stop()  # shuts the stream's socket: the thread ends now
            self._thread.join(10)
        assert failure is not None or self.error is None, f"the watch on Stack {self.name} failed: {self.error}"


def claims_current(obj: dict[str, Any]) -> bool:
    """What kstatus concludes: observedGeneration is the generation and nothing says Reconciling/Stalled."""
    status = obj.get("status") or {}
    return (status.get("observedGeneration") == obj["metadata"]["generation"]
            and not has_condition(obj, "Reconciling") and not has_condition(obj, "Stalled"))


def premature(versions: Versions) -> list[dict[str, Any]]:
    """Versions a kstatus client would take as done although the update for their generation had not run."""
    return [o.get("status") for o in versions.objects if claims_current(o)
            and ((o.get("status") or {}).get("lastUpdate") or {}).get("generation") != o["metadata"]["generation"]]


def answered(obj: dict[str, Any], request: str) -> bool:
    """The run for this reconciliation request has finished and Ready says so."""
    status = obj.get("status") or {}
    return (has_condition(obj, "Ready") and status.get("observedReconcileRequest") == request
            and (status.get("lastUpdate") or {}).get("reconcileRequest") == request)


def test_flux_requested_at_forces_exactly_one_run_and_is_echoed(stacks):
    stacks.program("fluxed", stash_program(n=1))
    stacks.create("fluxed", stacks.spec(programRef={"name": "fluxed"}))
    first = stacks.wait_ready("fluxed", 90)["status"]["lastUpdate"]
    assert "lastHandledReconcileAt" not in first

    at = "2025-06-01T10:00:00.000000000Z"
    with Versions(stacks, "fluxed") as versions:
        stacks.patch("fluxed", {"metadata": {"annotations": {FLUX_REQUEST: at}}})
        obj = stacks.wait("fluxed", lambda o: o["status"].get("lastHandledReconcileAt") == at
                          and has_condition(o, "Ready"), 90, f"the request at {at} handled")
        assert eventually_constant(lambda: stacks.runs("fluxed"), 5) == 2
    assert obj["status"]["lastUpdate"]["name"] != first["name"]
    assert obj["status"]["lastUpdate"]["state"] == "succeeded"
    assert any(at in e.message for e in stacks.events("fluxed", "StackUpdateDetected"))
    # The write that records the request as handled is the one that says Ready: never a Reconciling
    # "Reconcile requested at ..." left over after the run answered it.
    handled = [o for o in versions.objects if (o.get("status") or {}).get("lastHandledReconcileAt") == at]
    assert handled and all(has_condition(o, "Ready") for o in handled), [
        condition(o, "Reconciling") for o in handled]
    assert premature(versions) == []


def test_reconciliation_request_is_echoed_only_with_its_run(stacks):
    stacks.program("requested", stash_program(n=1))
    stacks.create("requested", stacks.spec(programRef={"name": "requested"}))
    stacks.wait_ready("requested", 90)

    with Versions(stacks, "requested") as versions:
        # Both annotations at once: one run answers both.
        stacks.patch("requested", {"metadata": {"annotations": {PULUMI_REQUEST: "r-1",
                                                                FLUX_REQUEST: "2025-06-01T11:00:00Z"}}})
        obj = stacks.wait("requested", lambda o: answered(o, "r-1")
                          and o["status"].get("lastHandledReconcileAt") == "2025-06-01T11:00:00Z", 90,
                          "both requests handled")
        assert eventually_constant(lambda: stacks.runs("requested"), 5) == 2
    assert obj["status"]["lastUpdate"]["state"] == "succeeded"
    # observedReconcileRequest never says Ready for r-1 before r-1's run has finished.
    echoed = [o for o in versions.objects if (o.get("status") or {}).get("observedReconcileRequest") == "r-1"]
    assert echoed and all(answered(o, "r-1") for o in echoed if has_condition(o, "Ready"))
    assert premature(versions) == []


def test_not_applicable_v2_fields_are_accepted_and_reported_once(stacks):
    stacks.program("pko-v2", stash_program(colour="blue"))
    template = {"spec": {"image": "pulumi/pulumi:3.150.0-nonroot",
                         "podTemplate": {"spec": {"containers": [{"name": "pulumi",
                                                                   "resources": {"requests": {"cpu": "1"}}}]}}}}
    with Versions(stacks, "pko-v2") as created:
        stacks.create("pko-v2", stacks.spec(programRef={"name": "pko-v2"}, workspaceTemplate=template))
        obj = stacks.wait_ready("pko-v2", 90)
    assert obj["spec"]["workspaceTemplate"] == template  # kept by the CRD, not pruned
    assert obj["status"]["outputs"] == {"colour": "blue"}
    assert obj["status"]["ignoredFields"] == ["workspaceTemplate"]
    reported = stacks.events("pko-v2", "StackConfigInvalid")
    assert len(reported) == 1 and "workspaceTemplate" in reported[0].message
    assert reported[0].type == "Normal"
    assert premature(created) == []

    # Later runs do not report it again; a newly added field is reported (once) with the other.
    stacks.patch("pko-v2", {"metadata": {"annotations": {PULUMI_REQUEST: "again"}}})
    stacks.wait("pko-v2", lambda o: answered(o, "again"), 90, "re-run for the request")
    assert len(stacks.events("pko-v2", "StackConfigInvalid")) == 1
    with Versions(stacks, "pko-v2") as changed:
        stacks.patch("pko-v2", {"spec": {"workspaceReclaimPolicy": "Delete", "config": {"unused": "x"}}})
        obj = stacks.wait("pko-v2", lambda o: has_condition(o, "Ready")
                          and o["status"]["lastUpdate"]["generation"] == 2, 90, "run for generation 2")
    assert obj["status"]["ignoredFields"] == ["workspaceTemplate", "workspaceReclaimPolicy"]
    messages = sorted(e.message for e in stacks.events("pko-v2", "StackConfigInvalid"))
    assert len(messages) == 2
    assert any("workspaceTemplate" in m and "workspaceReclaimPolicy" in m for m in messages), messages
    # Until the update for generation 2 has run, the status never looks current for generation 2.
    assert premature(changed) == []

    # Without them, nothing is reported as ignored any more.
    stacks.patch("pko-v2", {"spec": {"workspaceTemplate": None, "workspaceReclaimPolicy": None}})
    obj = stacks.wait("pko-v2", lambda o: has_condition(o, "Ready") and o["status"]["lastUpdate"]["generation"] == 3,
                      90, "run for generation 3")
    assert "ignoredFields" not in obj["status"]
    assert len(stacks.events("pko-v2", "StackConfigInvalid")) == 2
    assert stacks.runs("pko-v2") == 4
