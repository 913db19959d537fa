"""A team's state credentials under the real engine: TeamStateCredentials in an inline program on the
toolchain's pulumi CLI, its provider serialized and run by the dynamic-provider host, against MinIO from
the toolchain. The credentials are secret in state, a second run keeps them (rotation not due), and a
changed lifetime mints new ones."""

from __future__ import annotations

import pulumi

from strata_components import s3
from strata_components.team_state import TeamStateCredentials
from tests.conftest import OBJECT_STORE_BUCKET
from tests.engine.workspace import inline_stack, state_text


def test_credentials_are_minted_once_kept_secret_and_minted_again_when_their_inputs_change(
        toolchain, pulumi_env, file_backend, object_store):
    endpoint, root = object_store
    lifetime = {"seconds": 3600}

    def program() -> None:
        credentials = TeamStateCredentials(
            "alpha-state", endpoint=endpoint, bucket=s3.team_bucket(OBJECT_STORE_BUCKET, "alpha", "alpha"),
            store_credentials={"access_key_id": root.access_key_id, "secret_access_key": root.secret_access_key},
            lifetime_seconds=lifetime["seconds"])
        pulumi.export("environment", credentials.environment())
        pulumi.export("expiration", credentials.expiration)

    stack = inline_stack(toolchain, pulumi_env, file_backend, "team-state", "dev", program)
    first = stack.up(on_output=lambda _line: None)
    environment = first.outputs["environment"]
    assert environment.secret and set(environment.value) == set(s3.CREDENTIAL_ENV)
    minted = s3.Credentials(*(environment.value[key] for key in s3.CREDENTIAL_ENV))
    assert s3.request(endpoint, "GET", "/pulumi-state-team-alpha", minted)[0] == 200
    # Neither the store's secret nor the minted one is in state as plain text.
    state = state_text(file_backend)
    assert root.secret_access_key not in state and minted.secret_access_key not in state
    assert minted.session_token not in state

    second = stack.up(on_output=lambda _line: None)
    assert second.summary.resource_changes.get("update", 0) == 0
    assert second.outputs["environment"].value == environment.value

    lifetime["seconds"] = 7200
    third = stack.up(on_output=lambda _line: None)
    assert third.summary.resource_changes.get("update") == 1
    assert third.outputs["environment"].value["AWS_ACCESS_KEY_ID"] != minted.access_key_id
    stack.destroy(on_output=lambda _line: None)
    # The bucket holds the team's state: destroying the credentials keeps it.
    assert s3.request(endpoint, "HEAD", "/pulumi-state-team-alpha", root)[0] == 200
