"""Which resolved values are secret: from Secrets (and the operator's own env and files), the passphrase and
access token however given. Literal and ConfigMap values and plain spec fields are not."""

import asyncio

from strata_operator.services.redaction import redactor_for
from strata_operator.sources.references import resolve_stack
from strata_operator.api.stack import parse_stack_spec

SECRETS = {"creds": {"token": "secret-ref-canary-1", "passphrase": "passphrase-canary-2"},
           "bulk": {"BULK": "env-secrets-canary-3", "REGION": "overridden-below"},
           "pat": {"accessToken": "access-token-canary-4"}}
CONFIGMAPS = {"plain": {"LEVEL": "debug", "SHARED": "from-configmap"}}


async def _secret(namespace, name):
    return SECRETS.get(name)


async def _configmap(namespace, name):
    return CONFIGMAPS.get(name)


def test_secret_env_names_the_values_from_secrets_only(monkeypatch):
    monkeypatch.setenv("OPERATOR_OWN", "operator-env-canary-5")
    spec = parse_stack_spec({
        "stack": "dev", "programRef": {"name": "p"}, "backend": "file:///srv/state",
        "envs": ["plain"], "envSecrets": ["bulk"], "accessTokenSecret": "pat",
        "envRefs": {
            "TOKEN": {"type": "Secret", "secret": {"name": "creds", "key": "token"}},
            "PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": "creds", "key": "passphrase"}},
            "GREETING": {"type": "Literal", "literal": {"value": "hello-literal"}},
            "REGION": {"type": "Literal", "literal": {"value": "eu-west-1"}},
            "FROM_OPERATOR": {"type": "Env", "env": {"name": "OPERATOR_OWN"}},
        }}, "ns")
    resolved = asyncio.run(resolve_stack(spec, "ns", _secret, _configmap))
    assert resolved.env["PULUMI_BACKEND_URL"] == "file:///srv/state"
    assert resolved.env["REGION"] == "eu-west-1"  # a Literal over a Secret's key: plain now
    assert resolved.secret_env == {"TOKEN", "PULUMI_CONFIG_PASSPHRASE", "BULK", "PULUMI_ACCESS_TOKEN", "FROM_OPERATOR"}
    for plain in ("file:///srv/state", "hello-literal", "eu-west-1", "debug", "from-configmap"):
        assert redactor_for("ns").redact(plain) == plain
    for secret in ("secret-ref-canary-1", "passphrase-canary-2", "env-secrets-canary-3", "access-token-canary-4",
                   "operator-env-canary-5"):
        assert redactor_for("ns").redact(secret) == "[secret]"


def test_a_literal_passphrase_is_still_a_secret():
    spec = parse_stack_spec({"stack": "dev", "programRef": {"name": "p"}, "envRefs": {
        "PULUMI_CONFIG_PASSPHRASE": {"type": "Literal", "literal": {"value": "literal-passphrase-6"}}}}, "ns")
    resolved = asyncio.run(resolve_stack(spec, "ns", _secret, _configmap))
    assert resolved.secret_env == {"PULUMI_CONFIG_PASSPHRASE"}
    assert redactor_for("ns").redact("literal-passphrase-6") == "[secret]"
