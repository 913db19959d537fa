"""spec.approval Manual on the real operator and engine: every change is previewed into a saved plan and
nothing is applied until `strata approve` names that plan; a plan made stale by a new Program is
replaced and never applied; a tampered plan Secret is never applied."""

import base64
import json
from pathlib import Path

from .conftest import condition, eventually_constant, has_condition, stash_program
from .test_stack_cli import strata


def _awaiting(stack) -> bool:
    return has_condition(stack, "Reconciling", "AwaitingApproval")


def _checkpoint_types(stacks, project: str, stack: str) -> list[str]:
    path = Path(stacks.backend.removeprefix("file://")) / ".pulumi" / "stacks" / project / f"{stack}.json"
    if not path.exists():
        return []
    latest = json.loads(path.read_text())["checkpoint"].get("latest") or {}
    return [r["type"] for r in latest.get("resources") or []]


def test_only_the_approved_plan_is_applied_and_a_stale_one_never(stacks, local_platform):
    kubeconfig, ns = local_platform.kubeconfig_path, stacks.namespace
    stacks.program("gated", stash_program(greeting="hello"))
    stacks.create("gated", stacks.spec(stack="gated", programRef={"name": "gated"}, approval={"mode": "Manual"}))
    waiting = stacks.wait("gated", _awaiting, 90, "Reconciling/AwaitingApproval")
    plan = waiting["status"]["plan"]
    assert plan["digest"].startswith("sha256:") and plan["changes"].get("create") == 2, plan
    assert plan["revision"] == "gated/1" and plan["generation"] == waiting["metadata"]["generation"]
    message = condition(waiting, "Reconciling")["message"]
    assert plan["digest"] in message and "create 2" in message and f"strata approve {ns}/gated" in message
    assert len(stacks.wait_events("gated", "PlanAwaitingApproval")) == 1
    assert "pulumi:index:Stash" not in _checkpoint_types(stacks, "gated", "gated"), "nothing applied yet"

    secret = stacks.core.read_namespaced_secret("gated-plan-0", ns)
    assert secret.metadata.owner_references[0].uid == waiting["metadata"]["uid"]
    assert secret.metadata.labels["strata.dev/plan-of"] == "gated"
    assert base64.b64decode(secret.data["digest"]).decode() == plan["digest"]

    # A wrong digest approves nothing.
    stacks.patch("gated", {"metadata": {"annotations": {"strata.dev/approve": "sha256:" + "0" * 64}}})
    eventually_constant(lambda: (stacks.runs("gated"), stacks.get("gated")["status"]["plan"]["digest"]), 5)
    assert "pulumi:index:Stash" not in _checkpoint_types(stacks, "gated", "gated")

    approved = strata("approve", "stack", f"{ns}/gated", "-o", "json", "--timeout", "90s", kubeconfig=kubeconfig)
    assert approved.returncode == 0, approved.stderr
    assert f"► approving plan {plan['digest']}" in approved.stderr and "create 2" in approved.stderr
    assert json.loads(approved.stdout)["plan"] == plan["digest"]
    applied = stacks.get("gated")
    assert has_condition(applied, "Ready") and applied["status"]["outputs"]["greeting"] == "hello"
    assert applied["status"]["lastUpdate"]["plan"] == plan["digest"] and "plan" not in applied["status"]
    assert _checkpoint_types(stacks, "gated", "gated").count("pulumi:index:Stash") == 1
    assert not stacks.core.read_namespaced_secret("gated-plan-0", ns).data, "a used plan is emptied"

    # A new Program makes a new plan; a second change replaces it before approval, and approving the
    # replaced plan's digest then applies nothing.
    stacks.replace_program("gated", stash_program(greeting="second"))
    second = stacks.wait("gated", lambda o: _awaiting(o) and o["status"]["plan"]["revision"] == "gated/2", 90,
                         "a plan of the second Program")["status"]["plan"]
    assert any(n for op, n in second["changes"].items() if op != "same"), second
    stacks.replace_program("gated", stash_program(greeting="third"))
    third = stacks.wait("gated", lambda o: _awaiting(o) and o["status"]["plan"]["revision"] == "gated/3", 90,
                        "a plan of the third Program")["status"]["plan"]
    assert second["digest"] != third["digest"]
    stacks.patch("gated", {"metadata": {"annotations": {"strata.dev/approve": second["digest"]}}})
    eventually_constant(lambda: stacks.get("gated")["status"]["plan"]["digest"], 5)
    assert stacks.get("gated")["status"]["outputs"]["greeting"] == "hello", "the replaced plan was not applied"

    newest = strata("approve", "stack", "gated", "-n", ns, "--timeout", "90s", kubeconfig=kubeconfig)
    assert newest.returncode == 0, newest.stderr  # approves what the Stack shows now: the third
    after = stacks.get("gated")
    assert after["status"]["outputs"]["greeting"] == "third" and after["status"]["lastUpdate"]["plan"] == third["digest"]


def test_a_tampered_plan_is_never_applied(stacks, local_platform):
    ns = stacks.namespace
    stacks.program("guarded", stash_program(value="v1"))
    stacks.create("guarded", stacks.spec(stack="guarded", programRef={"name": "guarded"},
                                         approval={"mode": "Manual"}))
    first = stacks.wait("guarded", _awaiting, 90, "AwaitingApproval")["status"]["plan"]
    secret = stacks.core.read_namespaced_secret("guarded-plan-0", ns)
    forged = base64.b64decode(secret.data["plan"]).replace(b'"v1"', b'"forged"')
    stacks.core.patch_namespaced_secret("guarded-plan-0", ns, {"data": {"plan": base64.b64encode(forged).decode()}})

    # Approving the digest shown: the Secret no longer holds that plan, so a new preview replaces it.
    stacks.patch("guarded", {"metadata": {"annotations": {"strata.dev/approve": first["digest"]}}})
    replaced = stacks.wait("guarded", lambda o: _awaiting(o) and o["status"]["plan"]["digest"] != first["digest"], 90,
                           "a new plan replacing the tampered one")
    assert "pulumi:index:Stash" not in _checkpoint_types(stacks, "guarded", "guarded")
    assert replaced["status"].get("outputs") in (None, {})
