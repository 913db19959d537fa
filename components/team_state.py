"""TeamStateCredentials: a team's own state bucket in the platform's object store, and credentials that
reach that bucket only.

The platform layer holds the object store's credentials (its Stack's envRefs); a team must never get
them. Per team this resource creates the bucket if missing and mints temporary credentials by STS
AssumeRole with a session policy for that bucket alone (`strata_components.s3`): the store refuses them
on every other bucket, the platform's and other teams' included. Each platform run re-mints them once
less than half their lifetime is left (`s3.rotation_due`, checked in `diff`), and the Secrets built from
its outputs follow. Deleting it keeps the bucket (it holds the team's state) and cannot revoke the
credentials, which stop working at their expiration.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi.dynamic

from . import s3

# The Secret in a team's namespace holding its state credentials, as the AWS SDK's environment variables.
STATE_CREDENTIALS_SECRET = "strata-state-credentials"
# 30 days: re-minted after 15, so a platform Stack that runs at least every two weeks never lets them lapse.
DEFAULT_LIFETIME_SECONDS = 30 * 86400
SECRET_OUTPUTS = ["store_credentials", "access_key_id", "secret_access_key", "session_token"]


def credential_env_refs(secret: str) -> dict[str, Any]:
    """A Stack's envRefs handing its updates the state credentials in `secret` (of the Stack's namespace)."""
    return {key: {"type": "Secret", "secret": {"name": secret, "key": key}} for key in s3.CREDENTIAL_ENV}


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class TeamStateCredentialsProvider(pulumi.dynamic.ResourceProvider):
    """Creates the bucket and mints its credentials on create, and again on update when rotation is due."""

    def _mint(self, props: dict[str, Any]) -> dict[str, Any]:
        store = s3.Credentials(props["store_credentials"]["access_key_id"],
                               props["store_credentials"]["secret_access_key"])
        try:
            s3.ensure_bucket(props["endpoint"], props["bucket"], store)
            session = s3.assume_role(props["endpoint"], store, s3.bucket_policy(props["bucket"]),
                                     int(props["lifetime_seconds"]))
        except OSError as error:
            raise s3.S3Error(f"the object store {props['endpoint']} cannot be reached ({error}) for the state bucket "
                             f"{props['bucket']!r}") from None
        return {**props, "access_key_id": session.credentials.access_key_id,
                "secret_access_key": session.credentials.secret_access_key,
                "session_token": session.credentials.session_token,
                "issued": _now().isoformat(), "expiration": session.expiration.isoformat()}

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(id_=props["bucket"], outs=self._mint(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        replaces = [key for key in ("endpoint", "bucket") if olds.get(key) != news.get(key)]
        # New store credentials or lifetime: mint again (credentials minted by a retired user stop working).
        changed = any(olds.get(key) != news.get(key) for key in ("store_credentials", "lifetime_seconds"))
        due = s3.rotation_due(datetime.datetime.fromisoformat(olds["issued"]),
                              datetime.datetime.fromisoformat(olds["expiration"]), _now())
        return pulumi.dynamic.DiffResult(changes=bool(replaces) or changed or due, replaces=replaces,
                                         delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        return pulumi.dynamic.UpdateResult(outs=self._mint(news))


class TeamStateCredentials(pulumi.dynamic.Resource):
    """A team's state bucket and the temporary credentials that reach it alone (secret outputs)."""

    bucket: pulumi.Output[str]
    access_key_id: pulumi.Output[str]
    secret_access_key: pulumi.Output[str]
    session_token: pulumi.Output[str]
    expiration: pulumi.Output[str]
    """When the credentials stop working (ISO 8601, UTC); they are re-minted at half their lifetime."""

    def __init__(self, name: str, *, endpoint: str, bucket: str, store_credentials: pulumi.Input[Mapping[str, str]],
                 lifetime_seconds: int = DEFAULT_LIFETIME_SECONDS, opts: pulumi.ResourceOptions | None = None):
        props = {"endpoint": endpoint, "bucket": bucket, "lifetime_seconds": lifetime_seconds,
                 "store_credentials": pulumi.Output.secret(store_credentials),
                 "access_key_id": None, "secret_access_key": None, "session_token": None,
                 "issued": None, "expiration": None}
        super().__init__(TeamStateCredentialsProvider(), name, props, pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=SECRET_OUTPUTS)))

    def environment(self) -> pulumi.Output[dict[str, str]]:
        """The credentials as the AWS SDK's environment variables (secret), what a Secret for envRefs holds."""
        return pulumi.Output.secret(pulumi.Output.all(self.access_key_id, self.secret_access_key,
                                                      self.session_token).apply(
            lambda values: dict(zip(s3.CREDENTIAL_ENV, values, strict=True))))
