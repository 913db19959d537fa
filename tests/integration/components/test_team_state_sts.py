"""A team's state credentials against the real object store: MinIO from the toolchain on loopback, the
provider's own create and update (bucket, STS AssumeRole with the bucket's session policy), then the
credentials used as Pulumi's s3:// backend uses them. alpha's reach alpha's bucket and are refused on
beta's and on the platform's."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

import pytest

from strata_components import s3
from strata_components.team_state import TeamStateCredentialsProvider

from tests.conftest import OBJECT_STORE_BUCKET as PLATFORM_BUCKET
PROJECT = "name: team-state\nruntime: yaml\nresources:\n  note:\n    type: pulumi:index:Stash\n" \
          "    properties:\n      input: alpha\n"


def _props(endpoint: str, root: s3.Credentials, team: str, lifetime: int = 3600) -> dict:
    return {"endpoint": endpoint, "bucket": s3.team_bucket(PLATFORM_BUCKET, team, f"teams ({team})"),
            "lifetime_seconds": lifetime,
            "store_credentials": {"access_key_id": root.access_key_id, "secret_access_key": root.secret_access_key}}


def _session(outs: dict) -> s3.Credentials:
    return s3.Credentials(outs["access_key_id"], outs["secret_access_key"], outs["session_token"])


def test_a_teams_credentials_reach_its_bucket_and_nothing_else(object_store):
    endpoint, root = object_store
    provider = TeamStateCredentialsProvider()
    alpha = provider.create(_props(endpoint, root, "alpha"))
    beta = provider.create(_props(endpoint, root, "beta"))
    assert alpha.id == "pulumi-state-team-alpha"
    # Both buckets exist now (the store's own credentials see them).
    for bucket in ("pulumi-state-team-alpha", "pulumi-state-team-beta"):
        assert s3.request(endpoint, "HEAD", f"/{bucket}", root)[0] == 200
    credentials = _session(alpha.outs)
    assert credentials.access_key_id != root.access_key_id
    lifetime = (datetime.datetime.fromisoformat(alpha.outs["expiration"])
                - datetime.datetime.fromisoformat(alpha.outs["issued"])).total_seconds()
    assert 3500 < lifetime <= 3600

    assert s3.request(endpoint, "PUT", "/pulumi-state-team-alpha/probe", credentials, payload=b"alpha")[0] == 200
    assert s3.request(endpoint, "GET", "/pulumi-state-team-alpha/probe", credentials)[0] == 200
    assert s3.request(endpoint, "GET", "/pulumi-state-team-alpha", credentials)[0] == 200
    for bucket in ("pulumi-state-team-beta", PLATFORM_BUCKET):
        for method, path in (("GET", f"/{bucket}"), ("PUT", f"/{bucket}/probe"), ("GET", f"/{bucket}/probe")):
            status, body = s3.request(endpoint, method, path, credentials, payload=b"x" if method == "PUT" else b"")
            assert (status, s3.error_code(body)) == (403, "AccessDenied"), (method, path)
    # Nor may they mint themselves wider credentials.
    assert s3.request(endpoint, "PUT", "/pulumi-state-team-gamma", credentials)[0] == 403
    assert _session(beta.outs) != credentials


def test_rotation_mints_new_credentials_and_the_old_ones_keep_working_until_they_expire(object_store):
    endpoint, root = object_store
    provider = TeamStateCredentialsProvider()
    first = provider.create(_props(endpoint, root, "alpha")).outs
    # Issued long ago as far as the decision goes: more than half the lifetime has passed.
    aged = {**first, "issued": (datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=2)).isoformat()}
    news = _props(endpoint, root, "alpha")
    assert provider.diff("pulumi-state-team-alpha", first, news).changes is False
    assert provider.diff("pulumi-state-team-alpha", aged, news).changes is True
    second = provider.update("pulumi-state-team-alpha", aged, news).outs
    assert second["access_key_id"] != first["access_key_id"]
    assert s3.request(endpoint, "GET", "/pulumi-state-team-alpha", _session(second))[0] == 200


def test_a_store_refusing_assume_role_is_named_without_a_credential(object_store):
    endpoint, root = object_store
    wrong = s3.Credentials(root.access_key_id, "not-the-secret")
    props = {**_props(endpoint, root, "alpha"), "store_credentials": {"access_key_id": wrong.access_key_id,
                                                                      "secret_access_key": wrong.secret_access_key}}
    with pytest.raises(s3.S3Error) as error:
        TeamStateCredentialsProvider().create(props)
    assert "SignatureDoesNotMatch" in str(error.value) and "not-the-secret" not in str(error.value)


def test_pulumis_s3_backend_runs_a_stack_with_a_teams_credentials_in_its_bucket_only(object_store, pulumi_env,
                                                                                     tmp_path: Path):
    endpoint, root = object_store
    alpha = _session(TeamStateCredentialsProvider().create(_props(endpoint, root, "alpha")).outs)
    (tmp_path / "Pulumi.yaml").write_text(PROJECT)
    env = {**pulumi_env, "AWS_ACCESS_KEY_ID": alpha.access_key_id, "AWS_SECRET_ACCESS_KEY": alpha.secret_access_key,
           "AWS_SESSION_TOKEN": alpha.session_token}

    def pulumi(bucket: str, *args: str) -> subprocess.CompletedProcess:
        backend = f"s3://{bucket}?endpoint={endpoint}&use_path_style=true&region={s3.REGION}"
        return subprocess.run(["pulumi", *args, "--non-interactive"], cwd=tmp_path, capture_output=True, text=True,
                              env={**env, "PULUMI_BACKEND_URL": backend}, timeout=300)

    for args in (("stack", "init", "dev"), ("up", "--yes", "--skip-preview")):
        result = pulumi("pulumi-state-team-alpha", *args)
        assert result.returncode == 0, result.stdout + result.stderr
    refused = pulumi(PLATFORM_BUCKET, "stack", "ls")
    assert refused.returncode != 0 and "AccessDenied" in refused.stdout + refused.stderr, refused.stderr
