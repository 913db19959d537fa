"""Who may read the operator's metrics: on a host, whoever reaches loopback; in a pod (--metrics-auth
kubernetes), a client whose bearer token the API server accepts (TokenReview) for a user it lets get /metrics
(SubjectAccessReview), each answer kept a short while. The API server is a recorder here; the integration
test test_metrics_auth.py asks a real one."""

from __future__ import annotations

import contextlib
import logging
import urllib.error
import urllib.request

import kubernetes
import pytest

from strata_operator.main import build_parser
from strata_operator.services import metrics
from strata_operator.services.kube import Kube
from strata_operator.services.metrics import (ACCESS_REVIEWS, ALLOWED_SECONDS, REFUSED_SECONDS, REMEMBERED_TOKENS,
                                              TOKEN_REVIEWS, Access, ReviewedAccess, bearer_token,
                                              build_access_review, build_token_review, decide_access)

PROMETHEUS = {"username": "system:serviceaccount:monitoring:prometheus", "uid": "u-1",
              "groups": ["system:serviceaccounts", "system:authenticated"]}
NOBODY = {"username": "system:serviceaccount:team-alpha:default", "groups": ["system:authenticated"]}


def test_only_a_bearer_token_is_a_token():
    assert bearer_token("Bearer abc.def") == "abc.def"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic dXNlcjpwYXNz") == ""
    assert bearer_token("Bearer") == "" and bearer_token("") == ""


def test_the_reviews_ask_for_the_tokens_user_getting_the_metrics_url():
    assert build_token_review("t0k") == {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                         "spec": {"token": "t0k"}}
    review = build_access_review({**PROMETHEUS, "extra": {"authentication.kubernetes.io/pod-name": ["p"]}})
    assert review["kind"] == "SubjectAccessReview" and review["spec"] == {
        "user": PROMETHEUS["username"], "uid": "u-1", "groups": PROMETHEUS["groups"],
        "extra": {"authentication.kubernetes.io/pod-name": ["p"]},
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}


def test_the_decision_is_401_for_a_token_not_accepted_403_for_a_user_not_allowed_and_200_else():
    assert decide_access({"authenticated": False, "error": "token expired"}, None).status == 401
    assert decide_access({"authenticated": True, "user": {}}, None).status == 401
    refused = decide_access({"authenticated": True, "user": NOBODY}, {"allowed": False})
    assert refused == Access(403, "system:serviceaccount:team-alpha:default may not get /metrics: bind the "
                                  "ClusterRole strata-metrics-reader to it")
    assert decide_access({"authenticated": True, "user": PROMETHEUS}, {"allowed": True}).status == 200
    # A deny from an authorizer wins over an allow.
    assert decide_access({"authenticated": True, "user": PROMETHEUS}, {"allowed": True, "denied": True}).status == 403


class ApiServer:
    """Answers reviews as an API server would for the tokens it knows (`users`), `allowed` may get /metrics."""

    def __init__(self, users: dict[str, dict], allowed: set[str]):
        self.users, self.allowed, self.asked, self.down = users, allowed, [], False

    def review(self, path: str, body: dict) -> dict:
        self.asked.append(path)
        if self.down:
            raise ConnectionRefusedError("no API server")
        if path == TOKEN_REVIEWS:
            user = self.users.get(body["spec"]["token"])
            return {"authenticated": True, "user": user} if user else {"authenticated": False}
        assert path == ACCESS_REVIEWS and body["spec"]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        return {"allowed": body["spec"]["user"] in self.allowed}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _access(api: ApiServer) -> tuple[ReviewedAccess, Clock]:
    clock = Clock()
    return ReviewedAccess(api.review, clock), clock


def test_each_token_is_reviewed_and_its_answer_kept_a_short_while():
    api = ApiServer({"prom": PROMETHEUS, "alpha": NOBODY}, allowed={PROMETHEUS["username"]})
    access, clock = _access(api)
    assert access.check("").status == 401 and access.check("Basic eA==").status == 401
    assert api.asked == [], "no token: nothing to ask"
    assert access.check("Bearer forged").status == 401
    assert api.asked == [TOKEN_REVIEWS], "no user: no access review"
    assert access.check("Bearer alpha").status == 403
    assert access.check("Bearer prom").status == 200
    asked = len(api.asked)
    clock.now += ALLOWED_SECONDS - 1
    assert access.check("Bearer prom").status == 200 and len(api.asked) == asked, "kept"
    clock.now += 2
    assert access.check("Bearer prom").status == 200 and len(api.asked) == asked + 2, "asked again"
    # A refusal is kept a shorter while: a grant made meanwhile shows soon.
    assert access.check("Bearer alpha").status == 403
    api.allowed.add(NOBODY["username"])
    clock.now += REFUSED_SECONDS - 1
    assert access.check("Bearer alpha").status == 403
    clock.now += 2
    assert access.check("Bearer alpha").status == 200


def test_no_answer_from_the_api_server_is_503_and_not_kept_and_the_token_never_logged(caplog):
    api = ApiServer({"prom": PROMETHEUS}, allowed={PROMETHEUS["username"]})
    access, _ = _access(api)
    api.down = True
    with caplog.at_level(logging.WARNING):
        assert access.check("Bearer prom").status == 503
    assert "prom" not in caplog.text and "ConnectionRefusedError" in caplog.text
    api.down = False
    assert access.check("Bearer prom").status == 200


def test_random_tokens_cannot_grow_the_answers_kept_past_a_bound():
    api = ApiServer({}, allowed=set())
    access, _ = _access(api)
    for n in range(REMEMBERED_TOKENS + 50):
        assert access.check(f"Bearer random-{n}").status == 401
    assert len(access._answers) == REMEMBERED_TOKENS
    assert not any(b"random" in key for key in access._answers), "kept by digest, not the token itself"


@contextlib.contextmanager
def served(access: ReviewedAccess | None):
    server = metrics.serve(0, "127.0.0.1", access)
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str, token: str = "") -> tuple[int, dict, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def test_without_auth_the_metrics_are_served_on_the_address_given_to_anyone_reaching_it():
    with served(None) as base:
        status, _, body = _get(f"{base}/metrics")
    assert status == 200 and "stacks_active" in body


def test_with_auth_a_request_gets_the_metrics_only_with_a_token_whose_user_may_get_them():
    api = ApiServer({"prom": PROMETHEUS, "alpha": NOBODY}, allowed={PROMETHEUS["username"]})
    with served(ReviewedAccess(api.review)) as base:
        status, headers, body = _get(f"{base}/metrics")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer") and "stacks_active" not in body
        status, _, body = _get(f"{base}/metrics", "alpha")
        assert status == 403 and "strata-metrics-reader" in body and "stacks_active" not in body
        status, _, body = _get(f"{base}/metrics", "prom")
        assert status == 200 and "stacks_active" in body
        assert _get(f"{base}/", "prom")[0] == 404


def test_an_api_server_that_does_not_answer_opens_nothing():
    # A real client of an API server that is not there (a port nothing listens on).
    configuration = kubernetes.client.Configuration()
    configuration.host = "http://127.0.0.1:9"
    with served(ReviewedAccess(Kube(kubernetes.client.ApiClient(configuration)).review)) as base:
        assert _get(f"{base}/metrics", "prom")[0] == 503
        assert _get(f"{base}/metrics")[0] == 401


def test_the_metrics_are_on_loopback_unless_told_and_the_address_must_be_one():
    args = build_parser().parse_args([])
    assert (args.metrics_bind_address, args.metrics_auth) == ("127.0.0.1", "none")
    args = build_parser().parse_args(["--metrics-bind-address", "0.0.0.0", "--metrics-auth", "kubernetes"])
    assert (args.metrics_bind_address, args.metrics_auth) == ("0.0.0.0", "kubernetes")
    assert build_parser().parse_args(["--metrics-bind-address=::"]).metrics_bind_address == "::"


@pytest.mark.parametrize("argv", [["--metrics-bind-address", ":8383"], ["--metrics-bind-address", "localhost"],
                                  ["--metrics-auth", "basic"]])
def test_a_bad_metrics_flag_is_refused_naming_it(argv, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert f"argument {argv[0]}" in capsys.readouterr().err
