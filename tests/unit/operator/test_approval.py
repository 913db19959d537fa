"""Manual approval: when to preview a plan, apply it or wait, what the Stack says, and how plans are kept."""

from strata_operator.decisions.approval import (AWAITING_APPROVAL, PlanIdentity, approval_gate, inputs_digest,
                                                plan_chunks, plan_digest, plan_refused, plan_status)
from strata_operator.api.status import changes_text, has_changes

INPUTS = inputs_digest({"region": "eu"}, {"token": "s3cret"}, {"PULUMI_CONFIG_PASSPHRASE": "p"})
CURRENT = PlanIdentity(3, "abc123", "", INPUTS)
PLAN = b'{"manifest": {"time": "2026-11-24T08:11:26Z"}}'
SAVED = plan_status(CURRENT, plan_digest(PLAN), {"create": 2, "same": 1}, 1, "2026-11-24T08:11:27Z")


def gate(saved=SAVED, inputs=INPUTS, current=CURRENT, approved=""):
    return approval_gate(saved, inputs, current, approved, "apps", "web")


def test_no_plan_yet_or_its_secrets_gone_means_preview_one():
    assert gate(saved=None).action == "plan"
    assert gate(inputs=None).action == "plan", "a plan whose Secrets are gone cannot be applied"


def test_an_unapproved_plan_waits_saying_what_it_changes_and_how_to_approve():
    waiting = gate()
    assert waiting.action == "wait" and waiting.verdict.phase == "reconciling"
    assert waiting.verdict.reason == AWAITING_APPROVAL
    message = waiting.verdict.message
    assert SAVED["digest"] in message and "create 2" in message and "same" not in message and "abc123" in message
    assert "strata approve apps/web" in message and f"strata.dev/approve={SAVED['digest']}" in message


def test_a_plan_that_changes_nothing_is_applied_without_approval():
    idle = plan_status(CURRENT, plan_digest(PLAN), {"same": 3}, 1, "2026-11-24T08:11:27Z")
    assert gate(saved=idle).action == "apply"


def test_after_a_refusal_the_new_plan_says_why_the_last_one_was_not_applied():
    waiting = approval_gate(SAVED, INPUTS, CURRENT, "", "apps", "web", refused="note violates plan")
    assert waiting.action == "wait" and waiting.verdict.message.endswith(
        "the engine refused the last approved plan: note violates plan")


def test_only_the_digest_of_this_plan_approves_it():
    assert gate(approved="sha256:" + "0" * 64).action == "wait"
    assert gate(approved=SAVED["digest"]).action == "apply"


def test_a_plan_made_from_anything_else_than_now_is_replaced_never_applied():
    for current, what in ((PlanIdentity(4, "abc123", "", INPUTS), "generation"),
                          (PlanIdentity(3, "def456", "", INPUTS), "commit"),
                          (PlanIdentity(3, "abc123", "again", INPUTS), "reconcile request"),
                          (PlanIdentity(3, "abc123", "", inputs_digest({"region": "us"}, {}, {})),
                           "config or environment")):
        stale = gate(current=current, approved=SAVED["digest"])
        assert stale.action == "plan" and what in stale.message, what


def test_inputs_digest_changes_with_any_resolved_value_and_hides_them():
    assert inputs_digest({"a": 1}, {}, {}) != inputs_digest({"a": 2}, {}, {})
    assert inputs_digest({}, {"k": "x"}, {}) != inputs_digest({}, {"k": "y"}, {})
    assert inputs_digest({}, {}, {"E": "1"}) != inputs_digest({}, {}, {"E": "2"})
    assert "s3cret" not in INPUTS and INPUTS.startswith("sha256:")


def test_large_plans_are_cut_into_pieces_that_fit_a_secret():
    assert plan_chunks(b"") == [b""]
    pieces = plan_chunks(b"x" * 25, size=10)
    assert [len(p) for p in pieces] == [10, 10, 5] and b"".join(pieces) == b"x" * 25


def test_changes_read_in_the_engines_words():
    assert changes_text({"create": 1, "update": 0, "delete": 2, "same": 5}) == "create 1, delete 2"
    assert changes_text({"same": 3}) == "no changes"
    assert has_changes({"create": 1}) and not has_changes({"same": 4})


def test_the_engines_refusal_of_a_strayed_plan_is_recognised():
    assert plan_refused("resource urn:pulumi:dev::p::pulumi:index:Stash::note violates plan: properties changed")
    assert not plan_refused("missing required configuration variable 'region'")


def test_a_successful_updates_event_says_what_it_changed():
    from strata_operator.api.status import success_message

    assert success_message({"create": 2, "same": 1}) == "Successfully updated stack (create 2)"
    assert success_message({"same": 3}) == "Successfully updated stack (no changes)"
    assert success_message({}) == "Successfully updated stack"
