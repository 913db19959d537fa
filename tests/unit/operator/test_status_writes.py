"""What StackSession.write patches: observedGeneration and observedReconcileRequest only travel with the
conditions they qualify (kstatus reads observedGeneration == generation as "these conditions are
current"). The apiserver is replaced by a recorder of status patches."""

import asyncio
from datetime import datetime, timezone

from strata_operator.api import RECONCILE_REQUEST_ANNOTATION
from strata_operator.controllers.context import Context, OperatorSettings
from strata_operator.controllers.stack_session import StackSession
from strata_operator.api.status import RECONCILING_PROCESSING, Verdict, build_conditions

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc)


class RecordingKube:
    def __init__(self):
        self.patches = []

    async def patch_stack_status(self, namespace, name, status):
        self.patches.append(status)


def session(status, generation=2, request=""):
    ctx = Context(kube=RecordingKube(), engine=None, settings=OperatorSettings())
    body = {"metadata": {"namespace": "ns", "name": "s", "generation": generation,
                         "annotations": {RECONCILE_REQUEST_ANNOTATION: request} if request else {}},
            "status": status}
    return StackSession(ctx, body, logger=None)


READY_AT_1 = {"observedGeneration": 1, "observedReconcileRequest": "",
              "conditions": build_conditions(None, Verdict("ready"), 1, NOW)}


def test_fields_without_a_verdict_leave_the_observed_generation_alone():
    s = session(dict(READY_AT_1), generation=2, request="r-1")
    asyncio.run(s.write(ignoredFields=["workspaceTemplate"]))
    assert s.ctx.kube.patches == [{"ignoredFields": ["workspaceTemplate"]}]


def test_a_verdict_carries_the_generation_and_request_it_describes():
    s = session(dict(READY_AT_1), generation=2, request="r-1")
    asyncio.run(s.write(Verdict("reconciling", RECONCILING_PROCESSING, "stack is being processed")))
    [patch] = s.ctx.kube.patches
    assert patch["observedGeneration"] == 2 and patch["observedReconcileRequest"] == "r-1"
    assert [c["type"] for c in patch["conditions"]] == ["Ready", "Reconciling"]
