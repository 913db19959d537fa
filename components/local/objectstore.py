"""The cluster profile's S3-compatible object store: MinIO built from Go modules, for Pulumi's s3:// backend.

It listens on the pods' bridge (10.88.0.1:<port>, plain HTTP on the node-only network), reachable from the
host and from workspace pods, and keeps its data in the platform's state directory (kept across
`down`/`up`). Its credentials are generated once per platform into `objectstore/credentials` (0600, an
AWS shared-credentials file): MinIO gets them in its environment (never its argv, so never in a process
listing), a client on the host through AWS_SHARED_CREDENTIALS_FILE, a pod from a Secret; no log line
carries them. `up` creates the bucket `pulumi-state`.

A Stack uses it as `s3://<bucket>?endpoint=http://10.88.0.1:<port>&use_path_style=true&region=us-east-1`
(the query options gocloud.dev's s3blob takes, which Pulumi's S3 backend uses).
"""

from __future__ import annotations

import configparser
import datetime
import hashlib
import hmac
import http.client
import secrets
from pathlib import Path

from .kube import write_private
from .processes import HostProcess
from .realnode import NODE_ADDRESS

PROCESS = "object-store"
REGION = "us-east-1"
DEFAULT_BUCKET = "pulumi-state"
CREDENTIALS_PROFILE = "default"


class ObjectStoreError(Exception):
    """An object-store call failed; the message names the bucket or the credentials and the fix."""


def endpoint(port: int) -> str:
    return f"http://{NODE_ADDRESS}:{port}"


def backend_url(port: int, bucket: str = DEFAULT_BUCKET) -> str:
    """Pulumi's backend URL for a bucket of the object store."""
    return f"s3://{bucket}?endpoint={endpoint(port)}&use_path_style=true&region={REGION}"


def ensure_credentials(path: Path) -> tuple[str, str]:
    """The platform's access key and secret, generated on first use into an AWS credentials file (0600)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, f"[{CREDENTIALS_PROFILE}]\naws_access_key_id = strata-{secrets.token_hex(6)}\n"
                            f"aws_secret_access_key = {secrets.token_urlsafe(30)}\n")
    return read_credentials(path)


def read_credentials(path: Path) -> tuple[str, str]:
    parser = configparser.ConfigParser()
    parser.read(path)
    section = parser[CREDENTIALS_PROFILE]
    return section["aws_access_key_id"], section["aws_secret_access_key"]


def object_store_process(binary: Path, directory: Path, port: int, credentials: tuple[str, str]) -> HostProcess:
    """MinIO keeping everything under `directory` (data/, certs/: not ~/.minio), credentials in its environment."""
    access_key, secret_key = credentials
    return HostProcess(PROCESS, [str(binary), "server", str(directory / "data"), f"--address={NODE_ADDRESS}:{port}",
                                 f"--certs-dir={directory / 'certs'}", "--quiet"],
                       env={"MINIO_ROOT_USER": access_key, "MINIO_ROOT_PASSWORD": secret_key,
                            "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_CALLHOME_ENABLE": "off"})


def _sign(method: str, host: str, path: str, credentials: tuple[str, str], now: datetime.datetime,
          payload: bytes = b"") -> dict[str, str]:
    """AWS Signature Version 4 headers for a request without a query string (what bucket calls need)."""
    access_key, secret_key = credentials
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload_hash = hashlib.sha256(payload).hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": stamp}
    signed = ";".join(sorted(headers))
    canonical = "\n".join([method, path, "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed,
                           payload_hash])
    scope = f"{day}/{REGION}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{secret_key}".encode()
    for part in (day, REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {**headers, "Authorization": f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
                                        f"SignedHeaders={signed}, Signature={signature}"}


def _call(port: int, method: str, path: str, credentials: tuple[str, str]) -> tuple[int, str]:
    """One signed request for `/<bucket>[/<key>]` (keys of plain characters: no escaping here)."""
    return _call_endpoint(endpoint(port), method, path, credentials)


def head_bucket(endpoint_url: str, bucket: str, credentials: tuple[str, str]) -> int:
    """The status of HEAD on `bucket` at any S3 endpoint (http:// or https://), path-style."""
    return _call_endpoint(endpoint_url, "HEAD", f"/{bucket}", credentials, timeout=5)[0]


def _call_endpoint(endpoint_url: str, method: str, path: str, credentials: tuple[str, str],
                   timeout: float = 30) -> tuple[int, str]:
    scheme, _, host = endpoint_url.partition("://")
    headers = _sign(method, host, path, credentials, datetime.datetime.now(datetime.UTC))
    connection = (http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection)(host, timeout=timeout)
    try:
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    except OSError as error:
        raise ObjectStoreError(f"object store {host} unreachable ({error}); fix: start the platform "
                               "(strata local up --profile cluster)") from None
    finally:
        connection.close()


def _code(body: str) -> str:
    start = body.find("<Code>")
    return body[start + 6:body.find("</Code>")] if start >= 0 else "no error code"


def check_bucket(port: int, bucket: str, credentials: tuple[str, str], credentials_file: Path | None = None) -> None:
    """Nothing when the bucket exists and the credentials may use it, else one error naming which and the fix."""
    status, body = _call(port, "HEAD", f"/{bucket}", credentials)
    if status == 200:
        return
    if status == 404:
        raise ObjectStoreError(f"bucket {bucket!r} does not exist in the object store {endpoint(port)}; fix: "
                               f"create it (strata local bucket {bucket}) or use {DEFAULT_BUCKET!r}")
    if status == 403:
        source = f" ({credentials_file})" if credentials_file else ""
        raise ObjectStoreError(f"the object store {endpoint(port)} refused the credentials for bucket {bucket!r} "
                               f"({_code(body) if body else 'access denied'}); fix: use the platform's "
                               f"credentials{source}")
    raise ObjectStoreError(f"bucket {bucket!r} in {endpoint(port)}: HEAD answered {status} ({_code(body)})")


def object_exists(port: int, bucket: str, key: str, credentials: tuple[str, str]) -> bool:
    return _call(port, "HEAD", f"/{bucket}/{key}", credentials)[0] == 200


def ensure_bucket(port: int, bucket: str, credentials: tuple[str, str]) -> None:
    status, body = _call(port, "HEAD", f"/{bucket}", credentials)
    if status == 200:
        return
    status, body = _call(port, "PUT", f"/{bucket}", credentials)
    if status != 200:
        raise ObjectStoreError(f"creating bucket {bucket!r} in {endpoint(port)} answered {status} ({_code(body)})")
