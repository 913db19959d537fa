"""The console's page builders (strata_components.console.models): states, the overview's rows, filters
and counts, what Strata cares about among Flux's objects, plans as resource changes with secrets
masked, the Stack page, pending approvals, the layer graph and a Program's rollout waves."""

import json
from datetime import datetime, timezone

from strata_components.console import models
from strata_components.team_entries import CREATED_BY_STACK

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=timezone.utc)
SECRET_SIG = {models.SECRET_SIG_KEY: models.SECRET_SIG, "ciphertext": "v1:abc"}


def obj(kind_ns_name: str, conditions=None, **extra):
    namespace, name = kind_ns_name.split("/")
    found = {"metadata": {"namespace": namespace, "name": name, "creationTimestamp": "2026-01-02T11:00:00Z",
                          "generation": 1, **extra.pop("metadata", {})}, **extra}
    if conditions is not None:
        found.setdefault("status", {})["conditions"] = [
            {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": "2026-01-02T11:58:00Z"}
            for t, s, r, m in conditions]
    return found


READY = [("Ready", "True", "ProcessingCompleted", "")]
RETRYING = [("Ready", "False", "UpdateFailed", "boom"), ("Reconciling", "True", "RetryingAfterFailure", "retrying")]
STALLED = [("Ready", "False", "SpecInvalid", ""), ("Stalled", "True", "SpecInvalid", "spec.stack is required")]


def test_states_read_as_a_person_asks():
    assert models.object_state("Stack", obj("a/ok", READY)).state == "Ready"
    assert models.object_state("Stack", obj("a/new")).state == "Unknown"
    stalled = models.object_state("Stack", obj("a/bad", STALLED))
    assert (stalled.state, stalled.message) == ("Stalled", "spec.stack is required")
    failed = obj("a/retry", RETRYING)
    failed["status"]["lastUpdate"] = {"state": "failed", "reason": "UpdateFailed", "message": "exit 1: boom"}
    assert models.object_state("Stack", failed) == models.State("Failed", "UpdateFailed", "exit 1: boom")
    failed["status"]["currentUpdate"] = {"name": "x"}  # its retry is running
    assert models.object_state("Stack", failed).state == "Reconciling"
    assert models.object_state("Stack", obj("a/held", READY, spec={"suspend": True})).state == "Suspended"
    behind = obj("a/k", READY, metadata={"generation": 3})
    behind["status"]["observedGeneration"] = 2
    assert models.object_state("Kustomization", behind).state == "Reconciling"
    assert models.object_state("GitRepository", obj("a/g", [("Ready", "False", "GitOperationFailed", "x")])).state \
        == "Failed"
    rendered = obj("a/p", status={"observedGeneration": 1, "artifact": {"revision": "p/1"}})
    assert models.object_state("Program", rendered) == models.State("Ready", "Rendered", "revision p/1")
    stale = obj("a/p", metadata={"generation": 2}, status={"observedGeneration": 1, "artifact": {"revision": "p/1"}})
    assert models.object_state("Program", stale).state == "Reconciling"


def test_the_overview_lists_what_strata_cares_about_failing_first_and_filters():
    stacks = [obj("team-a/app", READY, metadata={"labels": {models.FLUX_NAME_LABEL: "team-a",
                                                           models.FLUX_NAMESPACE_LABEL: "team-a"}}),
              obj("team-a/broken", STALLED), obj("platform/core", READY,
                                                  spec={"fluxSource": {"sourceRef": {"kind": "GitRepository",
                                                                                     "name": "core"}}})]
    objects = {
        "Stack": stacks, "Program": [obj("team-a/hello", READY)],
        "Kustomization": [obj("team-a/team-a", READY, spec={"sourceRef": {"kind": "GitRepository", "name": "team-a"}}),
                          obj("flux-system/unrelated", READY)],
        "GitRepository": [obj("team-a/team-a", READY), obj("platform/core", READY), obj("flux-system/other", READY)],
    }
    view = models.overview(objects, models.Filters(), NOW)
    keys = [row.key for row in view.rows]
    assert keys[0] == "Stack/team-a/broken", "failing objects first"
    assert set(keys) == {"Stack/team-a/broken", "Stack/platform/core", "Stack/team-a/app", "Program/team-a/hello",
                         "Kustomization/team-a/team-a", "GitRepository/team-a/team-a", "GitRepository/platform/core"}
    assert view.counts["Ready"] == 6 and view.counts["Stalled"] == 1 and view.total == 7
    assert view.namespaces == ["platform", "team-a"]

    only = models.overview(objects, models.Filters(namespace="team-a", state="Stalled"), NOW)
    assert [r.key for r in only.rows] == ["Stack/team-a/broken"]
    assert only.counts["Ready"] == 4, "counts are of the namespace, before the state filter"
    row = only.rows[0]
    assert row.href == "/stacks/team-a/broken" and row.reason == "SpecInvalid" and row.age == "60m"
    assert models.dom_id(row.key) == "row-Stack--team-a--broken"
    assert models.Filters(namespace="x", state="Ready").query() == "namespace=x&state=Ready"


def test_a_plan_shows_each_changed_resource_with_its_diffs_and_never_a_secret():
    plan = {"resourcePlans": {
        "urn:pulumi:dev::app::pulumi:pulumi:Stack::app-dev": {"goal": {"type": "pulumi:pulumi:Stack"}, "steps": ["same"]},
        "urn:pulumi:dev::app::kubernetes:core/v1:Secret::creds": {
            "goal": {"type": "kubernetes:core/v1:Secret", "name": "creds",
                     "inputDiff": {"adds": {"stringData": {"password": SECRET_SIG, "user": "admin"}}}},
            "steps": ["create"]},
        "urn:pulumi:dev::app::pulumi:index:Stash::note": {
            "goal": {"type": "pulumi:index:Stash", "name": "note", "additionalSecretOutputs": ["input"],
                     "inputDiff": {"updates": {"input": "hunter2"}, "deletes": ["old"]}},
            "steps": ["update"]},
        "urn:pulumi:dev::app::random:index:RandomId::id": {
            "goal": {"type": "random:index:RandomId", "name": "id", "inputDiff": {"updates": {"byteLength": 8}}},
            "steps": ["create-replacement", "replace", "delete-replaced"]},
        "urn:pulumi:dev::app::pulumi:index:Stash::gone": {"goal": {}, "steps": ["delete"]},
    }}
    changes = models.plan_changes(json.dumps(plan).encode())
    assert [(c.op, c.name) for c in changes] == [("delete", "gone"), ("replace", "id"), ("update", "note"),
                                                 ("create", "creds")]
    creds = changes[3]
    assert creds.diffs == [models.PropertyDiff("+", "stringData", '{"password": "[secret]", "user": "admin"}')]
    note = changes[2]
    assert note.diffs == [models.PropertyDiff("~", "input", "[secret]"), models.PropertyDiff("-", "old", "")]
    rendered = repr(changes)
    assert "hunter2" not in rendered and "v1:abc" not in rendered
    assert changes[0].type == "pulumi:index:Stash", "the type from the URN when the goal has none"
    assert models.plan_changes(b"") == []


def test_mask_reaches_every_depth():
    assert models.mask({"a": [1, {"b": SECRET_SIG}], "c": SECRET_SIG}) == {"a": [1, {"b": "[secret]"}],
                                                                          "c": "[secret]"}


def test_the_stack_page_masks_secret_outputs_and_reads_its_history_from_events():
    stack = obj("apps/web", READY, spec={"stack": "org/web/dev", "programRef": {"name": "web"},
                                         "prerequisites": [{"name": "db"}]})
    stack["status"].update({"outputs": {"url": "http://x", "token": "[secret]", "cfg": {"k": SECRET_SIG}},
                            "lastUpdate": {"type": "up", "state": "succeeded", "lastResyncTime": "2026-01-02T11:59:00Z",
                                           "lastSuccessfulCommit": "a" * 40}})
    events = [
        {"reason": "StackUpdateDetected", "message": "Spec changed", "lastTimestamp": "2026-01-02T11:58:00Z"},
        {"reason": "StackCreated", "message": "Successfully updated stack (create 2)",
         "lastTimestamp": "2026-01-02T11:59:00Z"},
        {"reason": "Scheduled", "message": "not ours", "lastTimestamp": "2026-01-02T11:59:30Z"},
        {"reason": "StackUpdateFailure", "message": "boom", "type": "Warning", "count": 3,
         "lastTimestamp": "2026-01-02T11:50:00Z"}]
    page = models.stack_page(stack, events, NOW)
    assert page.outputs == [("cfg", '{"k": "[secret]"}'), ("token", "[secret]"), ("url", "http://x")]
    assert [(e.reason, e.count, e.warning) for e in page.history] == [
        ("StackCreated", 1, False), ("StackUpdateDetected", 1, False), ("StackUpdateFailure", 3, True)]
    assert page.source == "Program web" and page.prerequisites == ["db"] and page.row.commit == "aaaaaaaa"
    assert page.row.last_update == "up succeeded 1m ago"


def test_pending_plans_are_the_stacks_awaiting_approval():
    waiting = obj("apps/gated", [("Ready", "False", "AwaitingApproval", ""),
                                 ("Reconciling", "True", "AwaitingApproval", "plan sha256:1 awaits approval")])
    waiting["status"]["plan"] = {"digest": "sha256:1", "changes": {"create": 2, "same": 1}, "revision": "gated/1"}
    applying = obj("apps/other", [("Reconciling", "True", "StackProcessing", "")])
    applying["status"]["plan"] = {"digest": "sha256:2"}
    assert models.pending_plans([applying, waiting, obj("apps/plain", READY)]) == [
        models.PendingPlan("apps", "gated", "sha256:1", "create 2", "gated/1", "", "plan sha256:1 awaits approval")]


def test_layers_follow_prerequisites_stack_references_outputs_flux_and_what_the_platform_created():
    flux = {models.FLUX_NAME_LABEL: "team-alpha", models.FLUX_NAMESPACE_LABEL: "team-alpha"}
    handoff = "organization/strata-team-handoff/alpha"
    # What the platform layer stamps on the team's sync objects (TeamEnvironment: build_sync_metadata).
    by_platform = {"annotations": {CREATED_BY_STACK: "organization/platform/dev"}}
    reads_alpha = {"kind": "GitRepository", "name": "team-alpha"}
    platform = obj("strata-system/platform", READY, metadata={"labels": {"app.kubernetes.io/managed-by": "pulumi"}},
                   spec={"stack": "organization/platform/dev"})
    platform["status"]["outputs"] = {"teamHandoffStacks": {"alpha": handoff}, "teamPassphrases": "[secret]"}
    objects = {
        "Stack": [platform,
                  obj("strata-system/handoff-alpha", READY, spec={"stack": handoff}),
                  obj("team-alpha/app", RETRYING, metadata={"labels": flux},
                      spec={"stack": "organization/app/alpha", "config": {"app:handoffStack": handoff},
                            "fluxSource": {"sourceRef": reads_alpha, "dir": "programs/app-team"}}),
                  obj("team-alpha/db", READY, metadata={"labels": flux}, spec={"stack": "organization/db/alpha",
                                                                              "programRef": {"name": "db"}}),
                  obj("team-alpha/web", READY, metadata={"labels": flux},
                      spec={"stack": "organization/web/alpha", "prerequisites": [{"name": "db"}]})],
        "Program": [obj("team-alpha/db", READY, program={"resources": {"ref": {
            "type": "pulumi:pulumi:StackReference", "properties": {"name": "organization/platform/dev"}}}})],
        "Kustomization": [obj("team-alpha/team-alpha", READY, metadata=by_platform, spec={"sourceRef": reads_alpha})],
        "GitRepository": [obj("team-alpha/team-alpha", READY, metadata=by_platform)],
    }
    edges = {(e.source, e.target, e.why) for e in models.layer_edges(objects)}
    assert edges == {
        ("Stack/strata-system/platform", "Kustomization/team-alpha/team-alpha", "created"),
        ("Stack/strata-system/platform", "GitRepository/team-alpha/team-alpha", "created"),
        ("GitRepository/team-alpha/team-alpha", "Kustomization/team-alpha/team-alpha", "source"),
        ("GitRepository/team-alpha/team-alpha", "Stack/team-alpha/app", "source"),
        ("Stack/strata-system/platform", "Stack/strata-system/handoff-alpha", "outputs"),
        ("Stack/strata-system/handoff-alpha", "Stack/team-alpha/app", "StackReference"),
        ("Stack/strata-system/platform", "Stack/team-alpha/db", "StackReference"),
        ("Stack/team-alpha/db", "Stack/team-alpha/web", "prerequisite"),
        *(("Kustomization/team-alpha/team-alpha", f"Stack/team-alpha/{name}", "Flux") for name in ("app", "db", "web"))}
    graph = models.layers(objects)
    assert {n.key: n.layer for n in graph.nodes} == {
        "bootstrap": 0, "Stack/strata-system/platform": 1, "Stack/strata-system/handoff-alpha": 2,
        "GitRepository/team-alpha/team-alpha": 2, "Kustomization/team-alpha/team-alpha": 2,
        "Stack/team-alpha/db": 3, "Stack/team-alpha/app": 3, "Stack/team-alpha/web": 4}
    assert graph.columns == ["bootstrap", "platform", "teams", "apps", "layer 4"]
    assert {n.key: n.state for n in graph.nodes}["Stack/team-alpha/app"] == "Reconciling"
    assert all(a.source.x < a.target.x for a in graph.edges if a.edge.why != "source"), \
        "every arrow but a source's points to a later layer"
    read = next(a for a in graph.edges if a.edge.target == "Kustomization/team-alpha/team-alpha"
                and a.edge.why == "source")
    assert read.source.x == read.target.x and read.path.startswith(f"M{read.source.x},"), \
        "a source beside what reads it: a bracket on their left"
    team = models.layers(objects, "team-alpha")
    assert [n.key for n in team.nodes if n.layer == 0] == ["GitRepository/team-alpha/team-alpha",
                                                           "Kustomization/team-alpha/team-alpha"]
    assert team.columns == ["layer 1", "layer 2", "layer 3"], "no bootstrapped Stack there: layers by number"


def test_a_sync_a_stack_created_is_cared_for_before_it_applied_anything():
    platform = obj("strata-system/platform", READY, spec={"stack": "organization/platform/dev"})
    named = {"annotations": {CREATED_BY_STACK: "organization/platform/dev"}}
    stranger = {"annotations": {CREATED_BY_STACK: "organization/elsewhere/dev"}}
    objects = {"Stack": [platform],
               "Kustomization": [obj("team-beta/team-beta", READY, metadata=named,
                                     spec={"sourceRef": {"kind": "GitRepository", "name": "team-beta"}}),
                                 obj("team-gamma/team-gamma", READY, metadata=stranger)],
               "GitRepository": [obj("team-beta/team-beta", READY), obj("team-gamma/team-gamma", READY,
                                                                        metadata=stranger)]}
    cared = models.cared_for(objects)
    assert [models.key("Kustomization", k) for k in cared["Kustomization"]] == ["Kustomization/team-beta/team-beta"]
    assert [models.key("GitRepository", g) for g in cared["GitRepository"]] == ["GitRepository/team-beta/team-beta"], \
        "the source it reads; an annotation naming no Stack here ties nothing"
    graph = models.layers(objects)
    assert {(a.edge.source, a.edge.target, a.edge.why) for a in graph.edges} == {
        ("Stack/strata-system/platform", "Kustomization/team-beta/team-beta", "created"),
        ("GitRepository/team-beta/team-beta", "Kustomization/team-beta/team-beta", "source")}
    assert all(len(n.subtitle) <= models.SUBTITLE_CHARS for n in graph.nodes), [n.subtitle for n in graph.nodes]


def test_layers_survive_a_cycle():
    a = obj("n/a", READY, spec={"prerequisites": [{"name": "b"}]})
    b = obj("n/b", READY, spec={"prerequisites": [{"name": "a"}]})
    assert len(models.layers({"Stack": [a, b]}).nodes) == 2


def test_a_rollout_shows_each_wave_as_the_operator_assigns_it():
    program = obj("apps/fleet", READY, rollout={"waves": [{"selector": {"matchLabels": {"ring": "canary"}}},
                                                           {"count": 1}]},
                  status={"rollout": {"revision": "fleet/2", "currentWave": 2, "complete": False,
                                      "waves": [{"stacks": 1, "succeeded": 1, "failed": []}]}})

    def stack(name, ring=None, state="succeeded", commit="fleet/2"):
        found = obj(f"apps/{name}", READY, metadata={"labels": {"ring": ring} if ring else {}},
                    spec={"programRef": {"name": "fleet"}})
        found["status"]["lastUpdate"] = {"state": state, "lastSuccessfulCommit": commit if state == "succeeded" else "",
                                         "lastAttemptedCommit": commit, "message": "boom" if state == "failed" else ""}
        return found

    stacks = [stack("c1", "canary"), stack("s1", state="failed"), stack("s2", commit="fleet/1"),
              obj("other/c9", READY, spec={"programRef": {"name": "fleet"}})]
    view = models.rollout(program, stacks)
    assert view.revision == "fleet/2" and view.configured and not view.complete
    assert [(w.number, [s[0] for s in w.stacks], w.succeeded, w.failed, w.current) for w in view.waves] == [
        (1, ["c1"], 1, [], False), (2, ["s1"], 0, ["s1"], True), (3, ["s2"], 0, [], False)]
    assert view.waves[0].percent == 100 and view.waves[1].stacks[0][2] == "failed: boom"
    assert view.waves[2].stacks[0][2] == "waiting"


def _call(app, path: str, query: str = "", headers=(), method: str = "GET"):
    """One request straight through the ASGI app (no lifespan, so no watches): (status, headers, body)."""
    import asyncio

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": query.encode(),
             "headers": [(k.encode(), v.encode()) for k, v in headers], "scheme": "http", "server": ("127.0.0.1", 1),
             "client": ("127.0.0.1", 2), "root_path": "", "http_version": "1.1", "asgi": {"version": "3.0"}}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def test_only_the_printed_urls_token_opens_the_console_and_actions_need_htmx():
    from strata_components.console import app

    console = app.Console(None, [], 40517, token="s3cret-token")
    asgi = app.build_app(console)
    assert _call(asgi, "/vendor/htmx.min.js")[0] == 403
    assert _call(asgi, "/", "token=wrong")[0] == 403
    assert _call(asgi, "/", "token=s3cr%C3%A9t")[0] == 403, "a non-ASCII token is refused, not a server error"
    status, headers, _ = _call(asgi, "/layers", "token=s3cret-token&namespace=a")
    assert status == 303 and headers["location"] == "/layers?namespace=a", "the token leaves the address bar"
    cookie = headers["set-cookie"]
    assert cookie.startswith("strata_console_40517=s3cret-token;"), cookie
    assert {"HttpOnly", "Path=/", "SameSite=strict"} <= {part.strip() for part in cookie.split(";")}, cookie
    session = [("cookie", "strata_console_40517=s3cret-token")]
    status, headers, body = _call(asgi, "/vendor/htmx.min.js", headers=session)
    assert status == 200 and b"htmx" in body[:300], "served from node_modules"
    assert _call(asgi, "/stacks/a/b/suspend", headers=session, method="POST")[0] == 400, "a cross-site form"


def test_the_session_cookie_is_the_consoles_own_port_s_and_another_consoles_does_not_open_it():
    from strata_components.console import app

    # Two consoles on 127.0.0.1 (two users, or one user's two platforms): the browser sends both their
    # cookies to each, since it keeps cookies per host, not per port.
    mine, theirs = app.Console(None, [], 40517, token="mine"), app.Console(None, [], 40999, token="theirs")
    assert mine.cookie != theirs.cookie
    jar = [("cookie", f"{theirs.cookie}=theirs; {mine.cookie}=mine")]
    status, _, body = _call(app.build_app(mine), "/vendor/htmx.min.js", headers=jar)
    assert status == 200 and b"htmx" in body[:300], "its own cookie opens it, whatever else the jar holds"
    # Their console's session, set after mine, no longer replaces mine (one name for both did).
    status, headers, _ = _call(app.build_app(theirs), "/", "token=theirs")
    assert headers["set-cookie"].startswith(f"{theirs.cookie}=theirs;")
    assert _call(app.build_app(mine), "/", headers=[("cookie", f"{mine.cookie}=theirs")])[0] == 403
    assert _call(app.build_app(mine), "/", headers=[("cookie", "strata_console=mine")])[0] == 403, \
        "only the port's name counts"


def test_an_action_reads_the_digest_htmx_posts():
    from strata_components.console import app

    console = app.Console(None, [], 40517, token="t")
    asgi = app.build_app(console)
    session = [("cookie", f"{console.cookie}=t"), ("hx-request", "true"),
               ("content-type", "application/x-www-form-urlencoded")]
    status, _, body = _call(asgi, "/stacks/a/b/approve", headers=session, method="POST")
    assert status == 400 and b"digest" in body, "no digest: nothing approved"
