"""A team's own state bucket and credentials: bucket names, the session policy, the rotation decision, the
AssumeRole answer, and how the platform layer hands each team only its own (STS itself: the integration tier)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from strata_mocks import Harness, admin_kubeconfig, secret_value

from strata_components import s3
from strata_components.handoff import build_handoff_stack_spec
from strata_components.stack import build_stack_spec
from strata_components.team_state import TeamStateCredentialsProvider

ROOT = Path(__file__).resolve().parents[3]
DAY = datetime.timedelta(days=1)
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
BOOTSTRAP_STACK = "organization/strata/cluster"
BACKEND = "s3://pulumi-state?endpoint=http://10.88.0.1:9000&use_path_style=true&region=us-east-1"


def test_a_teams_bucket_is_the_platforms_with_the_team_in_its_name():
    assert s3.team_bucket("pulumi-state", "alpha", "strata:teams[0] (alpha)") == "pulumi-state-team-alpha"


def test_a_bucket_name_breaking_s3s_rules_names_the_team_entry_and_the_fix():
    long_team = "a" * 50  # a valid team name (a DNS label of 50), too long beside the platform's bucket
    with pytest.raises(ValueError) as error:
        s3.team_bucket("pulumi-state", long_team, "strata-platform:teams[2] (aaaa)")
    message = str(error.value)
    assert message.startswith("strata-platform:teams[2] (aaaa): the team's state bucket")
    assert "68 characters, S3 allows 3 to 63" in message and "at most 45 characters" in message


@pytest.mark.parametrize("name, problem", [
    ("ab", "2 characters"), ("Upper-case", "only a-z"), ("a..b", "no '..'"), ("a.-b", "no '..'"),
    ("192.168.1.1", "not an IP address"), ("xn--abc", "no prefix"), ("state-s3alias", "no prefix"),
    ("-state", "only a-z")])
def test_s3_bucket_naming_rules(name, problem):
    assert problem in s3.bucket_name_problem(name)


def test_valid_bucket_names_pass():
    assert s3.bucket_name_problem("pulumi-state.team-alpha") is None
    assert s3.bucket_name_problem("a" * 63) is None


def test_the_session_policy_allows_the_teams_bucket_and_its_objects_only():
    assert s3.bucket_policy("pulumi-state-team-alpha") == {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:*"],
                       "Resource": ["arn:aws:s3:::pulumi-state-team-alpha", "arn:aws:s3:::pulumi-state-team-alpha/*"]}]}


@pytest.mark.parametrize("now, due", [
    (T0, False), (T0 + 14 * DAY, False), (T0 + 15 * DAY - datetime.timedelta(seconds=1), False),
    (T0 + 15 * DAY + datetime.timedelta(seconds=1), True), (T0 + 31 * DAY, True)])
def test_credentials_rotate_once_less_than_half_their_lifetime_is_left(now, due):
    assert s3.rotation_due(T0, T0 + 30 * DAY, now) is due


def test_credentials_that_were_never_valid_rotate():
    assert s3.rotation_due(T0, T0, T0) is True


def test_an_assume_role_answer_gives_the_credentials_and_their_expiration():
    body = """<?xml version="1.0" encoding="UTF-8"?>
<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult><AssumedRoleUser><Arn></Arn>
<AssumeRoleId></AssumeRoleId></AssumedRoleUser><Credentials><AccessKeyId>KEY</AccessKeyId>
<SecretAccessKey>SECRET</SecretAccessKey><SessionToken>TOKEN</SessionToken>
<Expiration>2026-12-27T00:07:40Z</Expiration></Credentials></AssumeRoleResult></AssumeRoleResponse>"""
    session = s3.parse_assume_role(body)
    assert session.credentials == s3.Credentials("KEY", "SECRET", "TOKEN")
    assert session.expiration == datetime.datetime(2026, 12, 27, 0, 7, 40, tzinfo=datetime.UTC)


def test_an_assume_role_answer_without_credentials_is_an_error_naming_what_is_missing():
    with pytest.raises(s3.S3Error, match="AssumeRole answered without AccessKeyId"):
        s3.parse_assume_role("<AssumeRoleResponse><Credentials/></AssumeRoleResponse>")


def test_backend_urls_name_their_bucket_and_endpoint():
    assert s3.backend_bucket(BACKEND) == "pulumi-state"
    assert s3.backend_endpoint(BACKEND) == "http://10.88.0.1:9000"
    assert s3.backend_endpoint("s3://bucket?region=eu-west-1") is None
    assert s3.with_bucket(BACKEND, "pulumi-state-team-alpha") == BACKEND.replace("pulumi-state", "pulumi-state-team-alpha")


def _olds(issued: datetime.datetime, lifetime: datetime.timedelta) -> dict:
    return {"endpoint": "http://store", "bucket": "b", "lifetime_seconds": int(lifetime.total_seconds()),
            "store_credentials": {"access_key_id": "k", "secret_access_key": "s"},
            "issued": issued.isoformat(), "expiration": (issued + lifetime).isoformat()}


def test_the_provider_mints_again_only_when_rotation_is_due_or_its_inputs_changed():
    provider = TeamStateCredentialsProvider()
    now = datetime.datetime.now(datetime.UTC)
    fresh, old = _olds(now - DAY, 30 * DAY), _olds(now - 16 * DAY, 30 * DAY)
    inputs = {key: fresh[key] for key in ("endpoint", "bucket", "lifetime_seconds", "store_credentials")}
    assert provider.diff("b", fresh, inputs).changes is False
    assert provider.diff("b", old, inputs).changes is True
    assert provider.diff("b", fresh, {**inputs, "store_credentials": {"access_key_id": "k2",
                                                                      "secret_access_key": "s"}}).changes is True
    moved = provider.diff("b", fresh, {**inputs, "bucket": "c"})
    assert moved.changes is True and moved.replaces == ["bucket"]


def test_an_unreachable_store_is_named_without_a_credential():
    props = {**_olds(T0, 30 * DAY), "endpoint": "http://127.0.0.1:1",
             "store_credentials": {"access_key_id": "root-key", "secret_access_key": "root-secret"}}
    with pytest.raises(s3.S3Error) as error:
        TeamStateCredentialsProvider().create(props)
    assert "http://127.0.0.1:1 cannot be reached" in str(error.value) and "'b'" in str(error.value)
    assert "root-key" not in str(error.value) and "root-secret" not in str(error.value)


def test_the_handoff_stack_reads_the_teams_state_credentials_from_its_secret():
    spec = build_stack_spec(build_handoff_stack_spec("alpha", "team-alpha", BACKEND, state_credentials=True))
    assert spec["envRefs"]["AWS_SESSION_TOKEN"] == {"type": "Secret", "secret": {"name": "team-alpha-handoff",
                                                                                 "key": "AWS_SESSION_TOKEN"}}
    assert set(spec["envRefs"]) == {"PULUMI_CONFIG_PASSPHRASE", *s3.CREDENTIAL_ENV}


def platform_harness_on_s3() -> Harness:
    config = {"bootstrapStack": BOOTSTRAP_STACK, "backend": BACKEND, "namespace": "strata-system",
              "projectRepo": "http://git/strata.git", "syncPath": "clusters/dev",
              "teams": json.dumps([{"name": "alpha", "dir": "programs/app-team"}, {"name": "beta"}]),
              "statePassphrase": "pp"}
    return Harness(project="strata-platform", stack="cluster", config=config,
                   stack_outputs={BOOTSTRAP_STACK: {"kubeconfig": admin_kubeconfig(), "server": "https://127.0.0.1:6443"}},
                   secret_outputs={BOOTSTRAP_STACK: ["kubeconfig"]})


def test_on_an_object_store_each_team_gets_its_own_bucket_and_only_its_own_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "root-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "root-secret")
    harness = platform_harness_on_s3()
    out = harness.run_program(ROOT / "programs" / "platform" / "__main__.py")

    assert out["teamBackends"].value == {team: s3.with_bucket(BACKEND, f"pulumi-state-team-{team}")
                                         for team in ("alpha", "beta")}
    minted = {r.inputs["bucket"]: r for r in harness.all("pulumi-python:dynamic:Resource")}
    assert set(minted) == {"pulumi-state-team-alpha", "pulumi-state-team-beta"}
    for team in ("alpha", "beta"):
        bucket = f"pulumi-state-team-{team}"
        # Minted with the store's credentials (kept secret), by the team's environment.
        assert minted[bucket].inputs["endpoint"] == "http://10.88.0.1:9000"
        assert secret_value(minted[bucket].inputs["store_credentials"]) == {"access_key_id": "root-key",
                                                                             "secret_access_key": "root-secret"}
        assert minted[bucket].parent == harness.one("strata:index:TeamEnvironment", team).urn
        # The team's namespace and its hand-off Secret hold its own credentials, never the store's.
        team_secret = harness.one("kubernetes:core/v1:Secret", f"{team}-state-credentials")
        assert team_secret.inputs["metadata"]["name"] == "strata-state-credentials"
        assert team_secret.inputs["metadata"]["namespace"] == f"team-{team}"
        assert secret_value(team_secret.inputs["stringData"]) == {
            "AWS_ACCESS_KEY_ID": f"fake-key-{bucket}", "AWS_SECRET_ACCESS_KEY": f"fake-secret-{bucket}",
            "AWS_SESSION_TOKEN": f"fake-token-{bucket}"}
        handoff_data = secret_value(harness.one("kubernetes:core/v1:Secret", f"{team}-handoff-secret").inputs["stringData"])
        assert handoff_data["AWS_ACCESS_KEY_ID"] == f"fake-key-{bucket}"
        handoff = harness.one("kubernetes:pulumi.com/v1:Stack", f"{team}-handoff-stack").inputs["spec"]
        assert handoff["backend"] == out["teamBackends"].value[team]
        assert set(handoff["envRefs"]) == {"PULUMI_CONFIG_PASSPHRASE", *s3.CREDENTIAL_ENV}
        everything = json.dumps([r.inputs for r in harness.all("kubernetes:core/v1:Secret")
                                 if r.inputs["metadata"]["namespace"] == f"team-{team}"], default=str)
        assert "root-secret" not in everything and "root-key" not in everything
    # alpha's app Stack: its bucket, its credentials from its namespace's Secret.
    app = harness.one("kubernetes:pulumi.com/v1:Stack", "alpha-stack").inputs["spec"]
    assert app["backend"] == out["teamBackends"].value["alpha"]
    assert app["envRefs"]["AWS_SECRET_ACCESS_KEY"] == {"type": "Secret", "secret": {
        "name": "strata-state-credentials", "key": "AWS_SECRET_ACCESS_KEY"}}
    sync = harness.one("kubernetes:kustomize.toolkit.fluxcd.io/v1:Kustomization", "alpha-sync")
    assert sync.inputs["spec"]["postBuild"]["substitute"]["STRATA_BACKEND"] == out["teamBackends"].value["alpha"]


def test_without_the_stores_credentials_a_teams_state_is_a_prefix_of_the_platforms(monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    harness = platform_harness_on_s3()
    out = harness.run_program(ROOT / "programs" / "platform" / "__main__.py")
    assert out["teamBackends"].value["alpha"] == ("s3://pulumi-state/teams/alpha?endpoint=http://10.88.0.1:9000"
                                                  "&use_path_style=true&region=us-east-1")
    assert harness.all("pulumi-python:dynamic:Resource") == []
