"""Secrets never reach logs, events, status or exception text."""

import logging

from strata_operator.services.redaction import MASK, RedactingFilter, Redactor
from strata_operator.sources.archive import SourceError
from strata_operator.sources.git import GitCredentials, _git_env


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


def test_source_errors_are_redacted_at_construction():
    from strata_operator.services.redaction import REDACTOR
    REDACTOR.add("canary-4242-secret")
    assert "canary-4242-secret" not in str(SourceError("clone failed: canary-4242-secret"))


def test_git_token_goes_through_env_header_not_url(tmp_path):
    env = _git_env(GitCredentials(token="ghp_canary_token_1"), tmp_path)
    assert env["GIT_CONFIG_KEY_0"] == "http.extraHeader"
    assert "ghp_canary_token_1" not in env["GIT_CONFIG_VALUE_0"]  # base64 in a Basic header
    from strata_operator.services.redaction import REDACTOR
    assert "ghp_canary_token_1" not in REDACTOR.redact(env["GIT_CONFIG_VALUE_0"])
    assert MASK in REDACTOR.redact(env["GIT_CONFIG_VALUE_0"])
