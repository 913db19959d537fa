"""s3.ensure_bucket against a store that is not ready yet: MinIO's moment of 503 after its readiness check
passed cannot be produced on demand, so a scripted stand-in for `s3.request` answers here (the real MinIO
runs the rest of ensure_bucket in the engine and integration tiers)."""

import pytest

from strata_components import s3

NOT_READY = (503, "<Error><Code>XMinioServerNotInitialized</Code></Error>")
CREDENTIALS = s3.Credentials("id", "secret")


def _scripted_store(monkeypatch, answers):
    asked = []

    def answer(endpoint, method, path, credentials, **kwargs):
        asked.append(method)
        return answers.pop(0)
    monkeypatch.setattr(s3, "request", answer)
    monkeypatch.setattr(s3.time, "sleep", lambda seconds: None)
    return asked


def test_a_store_not_ready_yet_is_asked_again(monkeypatch):
    asked = _scripted_store(monkeypatch, [NOT_READY, (404, ""), NOT_READY, (404, ""), (200, "")])
    s3.ensure_bucket("http://127.0.0.1:9000", "state", CREDENTIALS)
    assert asked == ["HEAD", "HEAD", "PUT", "HEAD", "PUT"]


def test_a_store_that_stays_unavailable_names_its_answer(monkeypatch):
    _scripted_store(monkeypatch, [(404, ""), NOT_READY])
    with pytest.raises(s3.S3Error, match=r"creating bucket 'state' .* answered 503 \(XMinioServerNotInitialized\)"):
        s3.ensure_bucket("http://127.0.0.1:9000", "state", CREDENTIALS, unavailable_seconds=0)


def test_a_refusal_is_not_asked_again(monkeypatch):
    asked = _scripted_store(monkeypatch, [(404, ""), (403, "<Error><Code>AccessDenied</Code></Error>")])
    with pytest.raises(s3.S3Error, match="AccessDenied"):
        s3.ensure_bucket("http://127.0.0.1:9000", "state", CREDENTIALS)
    assert asked == ["HEAD", "PUT"]
