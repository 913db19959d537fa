"""A Program's rollout in waves on the real operator and engine, with 20 Stacks on one Program: two
canaries (by label), then the next five by name, then the rest; each wave only after every Stack of
the earlier ones ran the revision, the Program showing the progress, and a revision the canaries fail
never reaching the others."""

from .conftest import GROUP, VERSION, condition, eventually_constant, has_condition

CANARIES = ("canary-a", "canary-b")
OTHERS = tuple(f"s{index:02d}" for index in range(18))
WAVES = [set(CANARIES), set(OTHERS[:5]), set(OTHERS[5:])]


def _program(version: str, needs_config: bool = False) -> dict:
    resources = {"note": {"type": "pulumi:index:Stash", "properties": {"input": version}}}
    body: dict = {"resources": resources, "outputs": {"version": "${note.input}"}}
    if needs_config:  # only the Stacks that set `must` can run it: the canaries do not
        body["configuration"] = {"must": {"type": "String"}}
        resources["gate"] = {"type": "pulumi:index:Stash", "properties": {"input": "${must}"}}
    return body


def _finished(stacks, name: str) -> str:
    return stacks.get(name)["status"]["lastUpdate"]["lastResyncTime"]


def test_a_program_change_rolls_out_in_waves_and_halts_where_it_fails(stacks):
    stacks.custom.create_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "programs", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Program", "metadata": {"name": "fleet"},
        "rollout": {"waves": [{"selector": {"matchLabels": {"ring": "canary"}}}, {"count": 5}]},
        "program": _program("v1")})
    for name in CANARIES + OTHERS:
        labels = {"ring": "canary"} if name in CANARIES else {}
        config = {} if name in CANARIES else {"must": "ok"}
        stacks.custom.create_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "stacks", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": name, "labels": labels},
            "spec": stacks.spec(stack=name, programRef={"name": "fleet"}, config=config)})
    for name in CANARIES + OTHERS:
        stacks.wait_ready(name, 300)

    def rolled_out(revision: str):
        for name in CANARIES + OTHERS:
            stacks.wait(name, lambda o: has_condition(o, "Ready") and
                        o["status"]["lastUpdate"]["lastSuccessfulCommit"] == revision, 300, f"Ready at {revision}")

    stacks.custom.patch_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "programs", "fleet",
                                                 {"program": _program("v2")})
    # Mid-rollout, a Stack of the last wave says what it waits for.
    held = stacks.wait("s17", lambda o: has_condition(o, "Reconciling", "RolloutWaiting"), 60, "waiting its wave")
    assert "wave 3 of 3" in condition(held, "Reconciling")["message"]
    rolled_out("fleet/2")
    finished = [[_finished(stacks, name) for name in wave] for wave in WAVES]
    for earlier, later in zip(finished, finished[1:]):
        assert max(earlier) <= min(later), "a wave finished before an earlier one had"
    assert all(stacks.get(name)["status"]["outputs"]["version"] == "v2" for name in CANARIES + OTHERS)
    program = stacks.custom.get_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "programs", "fleet")
    assert program["status"]["rollout"] == {
        "revision": "fleet/2", "complete": True,
        "waves": [{"stacks": 2, "succeeded": 2, "failed": []}, {"stacks": 5, "succeeded": 5, "failed": []},
                  {"stacks": 13, "succeeded": 13, "failed": []}]}

    # A revision the canaries fail stops with them: nobody else runs it.
    runs = {name: stacks.runs(name) for name in OTHERS}
    stacks.custom.patch_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "programs", "fleet",
                                                 {"program": _program("v3", needs_config=True)})
    for name in CANARIES:
        stacks.wait(name, lambda o: o["status"]["lastUpdate"].get("state") == "failed" and
                    o["status"]["lastUpdate"]["lastAttemptedCommit"] == "fleet/3", 90, "failed fleet/3")
    halted = stacks.wait("s00", lambda o: has_condition(o, "Reconciling", "RolloutHalted"), 60, "halted")
    message = condition(halted, "Reconciling")["message"]
    assert "of wave 1 failed it" in message and any(f"Stack {name} " in message for name in CANARIES)
    assert "missing required configuration variable 'must'" in message
    eventually_constant(lambda: [stacks.runs(name) for name in OTHERS], 6)
    assert {name: stacks.runs(name) for name in OTHERS} == runs, "no Stack past the canaries ran fleet/3"
    assert all(stacks.get(name)["status"]["outputs"]["version"] == "v2" for name in OTHERS)
    progress = stacks.custom.get_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "programs",
                                                          "fleet")["status"]["rollout"]
    assert progress["revision"] == "fleet/3" and progress["currentWave"] == 1
    assert progress["halted"] == "wave 1: canary-a, canary-b failed fleet/3; later waves wait"


def test_a_wave_with_both_a_selector_and_a_count_is_refused_naming_it(stacks):
    from kubernetes import client

    try:
        stacks.custom.create_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "programs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Program", "metadata": {"name": "both"},
            "rollout": {"waves": [{"selector": {"matchLabels": {"ring": "a"}}, "count": 2}]},
            "program": _program("v1")})
    except client.ApiException as error:
        assert error.status == 422 and "rollout.waves[0]" in error.body
        assert "a wave has exactly one of selector and count" in error.body
    else:
        raise AssertionError("the API server accepted a wave with both a selector and a count")
