"""Secrets never reach logs, events, status or exception text, and one namespace's secrets never mask
another's: a team's status and Events are masked with its own namespace's secrets (and the operator's own
credentials), only the operator's log with every secret. The API server is replaced by a recorder of status
patches and Kopf's own queue of Events to post."""

import asyncio
import logging
import uuid
from datetime import datetime, timezone

import kopf
from kopf._core.engines import posting

from strata_operator.api.stack import parse_stack_spec
from strata_operator.api.status import STALLED_SOURCE_UNAVAILABLE, Verdict
from strata_operator.controllers.context import Context, OperatorSettings
from strata_operator.controllers.stack_session import StackSession
from strata_operator.engine.port import SerializedEngine, UpdateRequest, UpdateResult
from strata_operator.services.events import post_event
from strata_operator.services.flux_events import build_flux_event
from strata_operator.services.redaction import (LOG_REDACTOR, MASK, RedactingFilter, Redactor, add_operator_secrets,
                                                redactor_for)
from strata_operator.sources.archive import SourceError
from strata_operator.sources.git import GitCredentials, HostKeys, _git_env
from strata_operator.sources.references import resolve_stack


def test_registered_values_and_their_forms_are_masked():
    r = Redactor()
    r.add("s3cr3t-token", "-----BEGIN KEY-----\nline-one-abc\nline-two-def\n-----END KEY-----", None, "ab")
    text = r.redact("token=s3cr3t-token b64=czNjcjN0LXRva2Vu key line: line-two-def short=ab")
    assert "s3cr3t-token" not in text and "czNjcjN0LXRva2Vu" not in text and "line-two-def" not in text
    assert text.count(MASK) == 3 and "short=ab" in text  # 2-char values are not secrets worth masking words for


def test_longer_secret_masked_whole():
    r = Redactor()
    r.add("abcd", "abcdefgh")
    assert r.redact("x abcdefgh y") == f"x {MASK} y"


def test_unregistered_credentials_in_urls_headers_and_keys():
    r = Redactor()
    text = r.redact("fatal: https://user:tok123@git.example.com/r.git Authorization: Basic dXNlcjpwYXNz "
                    "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----")
    assert "tok123" not in text and "dXNlcjpwYXNz" not in text and "AAAA" not in text
    assert "git.example.com" in text


def test_log_filter_masks_message_args_and_traceback():
    r = Redactor()
    r.add("hunter2hunter2")
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "value %s", ("hunter2hunter2",), None)
    try:
        raise ValueError("hunter2hunter2 leaked")
    except ValueError as err:
        record.exc_info = (type(err), err, err.__traceback__)
    assert RedactingFilter(r).filter(record)
    rendered = logging.Formatter().format(record)
    assert "hunter2hunter2" not in rendered and MASK in rendered


def test_a_git_token_goes_through_env_header_not_url(tmp_path):
    redactor = Redactor()
    env = _git_env(GitCredentials(token="ghp_canary_token_1", redactor=redactor), tmp_path,
                   HostKeys(tmp_path / "known_hosts", given=False))
    assert env["GIT_CONFIG_KEY_0"] == "http.extraHeader"
    assert "ghp_canary_token_1" not in env["GIT_CONFIG_VALUE_0"]  # base64 in a Basic header
    header = env["GIT_CONFIG_VALUE_0"].removeprefix("Authorization: Basic ")
    assert redactor.redact(f"server said: {header}") == f"server said: {MASK}"  # registered, not only the pattern


NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


# --- scopes ------------------------------------------------------------------------------------


def _teams() -> tuple[str, str]:
    """Two fresh namespaces: the redactors are the process's, shared by every test."""
    suffix = uuid.uuid4().hex[:6]
    return f"team-alpha-{suffix}", f"team-beta-{suffix}"


def _resolve(namespace: str, secrets: dict[str, str]) -> None:
    """A Stack of the namespace with spec.secrets literals, resolved as the operator does before any run."""
    async def nothing(_namespace, _name):
        return None

    spec = parse_stack_spec({"stack": "dev", "programRef": {"name": "p"}, "secrets": secrets}, namespace)
    asyncio.run(resolve_stack(spec, namespace, nothing, nothing))


class RecordingKube:
    def __init__(self):
        self.patches = []

    async def patch_stack_status(self, namespace, name, status):
        self.patches.append(status)


def _stack(namespace: str) -> dict:
    return {"apiVersion": "pulumi.com/v1", "kind": "Stack",
            "metadata": {"namespace": namespace, "name": "app", "uid": f"uid-{namespace}", "generation": 1},
            "status": {}}


def _stalled_message(namespace: str, message: str) -> str:
    """The Stalled message a Stack of `namespace` writes for `message`."""
    session = StackSession(Context(kube=RecordingKube(), engine=None, settings=OperatorSettings()), _stack(namespace),
                           logger=None)
    asyncio.run(session.write(Verdict("stalled", STALLED_SOURCE_UNAVAILABLE, message)))
    [patch] = session.ctx.kube.patches
    return next(c["message"] for c in patch["conditions"] if c["type"] == "Stalled")


def _event_message(body: dict, message: str) -> str:
    """The message of the Event post_event hands Kopf to post on `body`."""
    async def post() -> str:
        queue: asyncio.Queue = asyncio.Queue()
        tokens = [(var, var.set(value)) for var, value in ((posting.settings_var, kopf.OperatorSettings()),
                                                            (posting.event_queue_loop_var, asyncio.get_running_loop()),
                                                            (posting.event_queue_var, queue))]
        try:
            post_event(body, "StackUpdateFailure", message, warning=True, to_flux=False)
        finally:
            for var, token in reversed(tokens):
                var.reset(token)
        return queue.get_nowait().message
    return asyncio.run(post())


def _logged(message: str) -> str:
    record = logging.LogRecord("strata", logging.INFO, __file__, 1, "%s", (message,), None)
    RedactingFilter().filter(record)
    return record.getMessage()


def test_a_teams_secret_literal_masks_its_own_status_and_events_and_never_another_teams():
    """The issue's route: alpha puts a common word into its own spec.secrets. Beta's status and Events keep
    the word (alpha can neither mask nor probe them), alpha's own still mask it, the operator's log masks both
    teams' secrets."""
    alpha, beta = _teams()
    _resolve(alpha, {"word": "deploy"})
    _resolve(beta, {"token": "beta-token-7f3e"})
    said = "git fetch failed: cannot deploy from the branch"
    assert _stalled_message(beta, said) == said
    assert _event_message(_stack(beta), said) == said
    assert build_flux_event(_stack(beta), "StackUpdateFailure", said, now=NOW, instance="h")["message"] == said
    assert _stalled_message(alpha, said) == f"git fetch failed: cannot {MASK} from the branch"
    assert _event_message(_stack(alpha), said) == f"git fetch failed: cannot {MASK} from the branch"
    # The other way: beta's value in alpha's text (alpha's guess at beta's token) is not masked either.
    assert _stalled_message(alpha, "branch 'beta-token-7f3e' not found") == "branch 'beta-token-7f3e' not found"
    assert _logged("deploy with beta-token-7f3e") == f"{MASK} with {MASK}"


def test_a_source_error_masks_only_credentials_in_urls_until_it_is_shown():
    """A source error knows no namespace: masking it with every namespace's secrets would let alpha's guess
    (a branch named as beta's secret) turn [secret] in alpha's own status."""
    alpha, beta = _teams()
    _resolve(beta, {"token": "beta-token-1c2d"})
    err = SourceError("branch 'beta-token-1c2d' not found in https://user:tok-5e6f@git.example/app.git")
    assert str(err) == f"branch 'beta-token-1c2d' not found in https://{MASK}@git.example/app.git"
    assert _stalled_message(alpha, str(err)) == str(err)
    assert _stalled_message(beta, str(err)) == f"branch '{MASK}' not found in https://{MASK}@git.example/app.git"


class EchoingEngine(SerializedEngine):
    """Reports, for every operation, a failure quoting its stack's request."""

    def __init__(self, said: str):
        super().__init__(concurrency=1)
        self.said = said

    async def _run_locked(self, operation, request):
        return UpdateResult("failed", self.said, outputs_error=self.said)


def test_an_engine_result_is_masked_with_its_stacks_namespace():
    alpha, beta = _teams()
    said = "error: alpha-config-3a4b and beta-config-5c6d"
    engine = EchoingEngine(said)
    for namespace, value in ((alpha, "alpha-config-3a4b"), (beta, "beta-config-5c6d")):
        request = UpdateRequest(stack_key=f"{namespace}/app", stack_name="dev", project_dir="/p",
                                secret_config={"pw": value})
        result = asyncio.run(engine.up(request))
        assert result.message == result.outputs_error == said.replace(value, MASK)


def test_the_operators_own_credentials_are_masked_in_every_namespace_seen_before_or_after():
    alpha, beta = _teams()
    before = redactor_for(alpha)
    add_operator_secrets(f"operator-token-{alpha}", None)
    for redactor in (before, redactor_for(beta), LOG_REDACTOR):
        assert redactor.redact(f"Bearer operator-token-{alpha}") == f"Bearer {MASK}"
