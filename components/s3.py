"""S3 and STS over plain HTTP with AWS Signature Version 4, for an S3-compatible object store (MinIO):
the signer, one request, bucket names, and the scoped credentials each team's state gets.

A team's credentials come from STS AssumeRole signed with the object store's own credentials, with a
session policy allowing its bucket only (the store refuses them everywhere else). They expire;
`rotation_due` says when to mint new ones. Pure and light (the standard library only): the platform
layer's provider, the local platform and the tests use it.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import http.client
import ipaddress
import json
import re
import time
import urllib.parse
import xml.etree.ElementTree as ElementTree

REGION = "us-east-1"
# How long a store that answers 503 (not ready, slow down) is asked again.
UNAVAILABLE_RETRY_SECONDS = 15.0
STS_VERSION = "2011-06-15"
# The Pulumi backend's environment variables for S3 credentials (the AWS SDK's).
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# What Pulumi's s3:// backend reads long-lived credentials from (no session token).
BACKEND_CREDENTIAL_KEYS = CREDENTIAL_ENV[:2]


class S3Error(Exception):
    """An S3 or STS call failed; the message names what and the store's own error code, never a credential."""


@dataclasses.dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


@dataclasses.dataclass(frozen=True)
class Session:
    """Temporary credentials from AssumeRole and when they stop working."""

    credentials: Credentials
    expiration: datetime.datetime


def sign(method: str, host: str, path: str, credentials: Credentials, now: datetime.datetime, *,
         payload: bytes = b"", query: str = "", service: str = "s3", region: str = REGION,
         content_type: str | None = None) -> dict[str, str]:
    """The headers of a SigV4-signed request (`query` already canonical: sorted, percent-encoded)."""
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload_hash = hashlib.sha256(payload).hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": stamp}
    if content_type:
        headers["content-type"] = content_type
    if credentials.session_token:
        headers["x-amz-security-token"] = credentials.session_token
    signed = ";".join(sorted(headers))
    canonical = "\n".join([method, path, query, *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed,
                           payload_hash])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{credentials.secret_access_key}".encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {**headers, "Authorization": f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope}, "
                                        f"SignedHeaders={signed}, Signature={signature}"}


def request(endpoint: str, method: str, path: str, credentials: Credentials, *, payload: bytes = b"",
            service: str = "s3", content_type: str | None = None, query: dict[str, str] | None = None,
            timeout: float = 30) -> tuple[int, str]:
    """One signed request to `endpoint` (http:// or https://) for `path` (plain characters: no escaping
    here) with `query`; the status and body. OSError when the store cannot be reached."""
    scheme, _, host = endpoint.rstrip("/").partition("://")
    # SigV4's canonical query: sorted, every value percent-encoded ('/' too).
    canonical = "&".join(f"{k}={urllib.parse.quote(v, safe='-_.~')}" for k, v in sorted((query or {}).items()))
    headers = sign(method, host, path, credentials, datetime.datetime.now(datetime.UTC), payload=payload,
                   service=service, content_type=content_type, query=canonical)
    connection = (http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection)(host, timeout=timeout)
    try:
        connection.request(method, f"{path}?{canonical}" if canonical else path, body=payload or None,
                           headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def error_code(body: str) -> str:
    """The `<Code>` of an S3/STS error document."""
    match = re.search(r"<Code>([^<]*)</Code>", body)
    return match.group(1) if match else "no error code"


# -- buckets -----------------------------------------------------------------------------------------

def bucket_name_problem(name: str) -> str | None:
    """Why `name` breaks S3's bucket naming rules, or None."""
    if not 3 <= len(name) <= 63:
        return f"{len(name)} characters, S3 allows 3 to 63"
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*[a-z0-9]", name):
        return "only a-z, 0-9, '.' and '-', beginning and ending with a letter or digit"
    if ".." in name or ".-" in name or "-." in name:
        return "no '..', '.-' or '-.'"
    try:
        ipaddress.IPv4Address(name)
        return "not an IP address"
    except ValueError:
        pass
    if name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3")):
        return "no prefix xn--/sthree- and no suffix -s3alias/--ol-s3"
    return None


def team_bucket(platform_bucket: str, team: str, field: str) -> str:
    """A team's state bucket: `<platform bucket>-team-<team>`. `field` names the team's entry (e.g.
    strata:teams[0] (alpha)) for the error when the name breaks S3's rules."""
    name = f"{platform_bucket}-team-{team}"
    problem = bucket_name_problem(name)
    if problem:
        room = 63 - len(f"{platform_bucket}-team-")
        raise ValueError(f"{field}: the team's state bucket {name!r} breaks S3's bucket naming rules ({problem}); "
                         f"fix: give the team a name of at most {room} characters, or the platform's backend a "
                         f"shorter bucket than {platform_bucket!r}")
    return name


def ensure_bucket(endpoint: str, bucket: str, credentials: Credentials,
                  unavailable_seconds: float = UNAVAILABLE_RETRY_SECONDS) -> None:
    """Create `bucket` unless it exists; an S3Error naming the bucket and the store's answer otherwise.
    A 503 is asked again for `unavailable_seconds`, as AWS's SDKs do: MinIO answers one
    (XMinioServerNotInitialized) for a moment after its readiness check passed."""
    deadline = time.monotonic() + unavailable_seconds
    while True:
        status, body = request(endpoint, "HEAD", f"/{bucket}", credentials)
        if status == 200:
            return
        if status != 503:
            status, body = request(endpoint, "PUT", f"/{bucket}", credentials)
        if status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # 409 BucketAlreadyOwnedByYou: created meanwhile.
    if status != 200 and error_code(body) != "BucketAlreadyOwnedByYou":
        raise S3Error(f"creating bucket {bucket!r} in {endpoint} answered {status} ({error_code(body)}); fix: "
                      "give the platform credentials that may create buckets")


def bucket_policy(bucket: str) -> dict:
    """A session policy allowing everything on `bucket` and its objects, nothing else."""
    return {"Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:*"],
                           "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}


# -- STS ---------------------------------------------------------------------------------------------

def parse_assume_role(body: str) -> Session:
    """The credentials of an AssumeRole answer."""
    root = ElementTree.fromstring(body)
    found = {element.tag.rsplit("}", 1)[-1]: (element.text or "") for element in root.iter()}
    try:
        credentials = Credentials(found["AccessKeyId"], found["SecretAccessKey"], found["SessionToken"])
        expiration = datetime.datetime.fromisoformat(found["Expiration"].replace("Z", "+00:00"))
    except KeyError as missing:
        raise S3Error(f"AssumeRole answered without {missing.args[0]}") from None
    return Session(credentials, expiration)


def assume_role(endpoint: str, credentials: Credentials, policy: dict, duration_seconds: int) -> Session:
    """STS AssumeRole at the object store, signed with `credentials`: new credentials limited to `policy`."""
    form = urllib.parse.urlencode({"Action": "AssumeRole", "Version": STS_VERSION,
                                   "DurationSeconds": str(duration_seconds), "Policy": json.dumps(policy)}).encode()
    status, body = request(endpoint, "POST", "/", credentials, payload=form, service="sts",
                           content_type="application/x-www-form-urlencoded")
    if status != 200:
        raise S3Error(f"STS AssumeRole at {endpoint} answered {status} ({error_code(body)}); fix: the platform's "
                      "object-store credentials must be a user that may assume roles (MinIO's root user or one "
                      "with an STS-enabled policy)")
    return parse_assume_role(body)


def rotation_due(issued: datetime.datetime, expiration: datetime.datetime, now: datetime.datetime) -> bool:
    """Credentials are re-minted once less than half their lifetime is left (or they were never valid)."""
    return expiration - now < (expiration - issued) / 2 or expiration <= issued


# -- Pulumi's s3:// backend URL ----------------------------------------------------------------------

def backend_bucket(backend: str) -> str:
    """The bucket of an s3:// backend URL."""
    return urllib.parse.urlsplit(backend).netloc


def backend_endpoint(backend: str) -> str | None:
    """The `endpoint` query option of an s3:// backend URL (an S3-compatible store), or None (AWS itself)."""
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(backend).query).get("endpoint")
    return values[0] if values else None


def with_bucket(backend: str, bucket: str) -> str:
    """The same s3:// backend URL, options kept, for another bucket."""
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(backend)._replace(netloc=bucket, path=""))
