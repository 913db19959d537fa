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
import secrets
from pathlib import Path

from .. import s3
from .kube import write_private
from .processes import HostProcess
from .realnode import NODE_ADDRESS

PROCESS = "object-store"
REGION = s3.REGION
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


def object_store_process(binary: Path, directory: Path, port: int, credentials: tuple[str, str],
                         address: str = NODE_ADDRESS) -> HostProcess:
    """MinIO keeping everything under `directory` (data/, certs/: not ~/.minio), credentials in its environment;
    on the address pods reach (the tests' own store listens on loopback)."""
    access_key, secret_key = credentials
    return HostProcess(PROCESS, [str(binary), "server", str(directory / "data"), f"--address={address}:{port}",
                                 f"--certs-dir={directory / 'certs'}", "--quiet"],
                       env={"MINIO_ROOT_USER": access_key, "MINIO_ROOT_PASSWORD": secret_key,
                            "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_CALLHOME_ENABLE": "off"})


def _call(port: int, method: str, path: str, credentials: tuple[str, str]) -> tuple[int, str]:
    """One signed request for `/<bucket>[/<key>]` (keys of plain characters: no escaping here)."""
    return _call_endpoint(endpoint(port), method, path, credentials)


def head_bucket(endpoint_url: str, bucket: str, credentials: tuple[str, str]) -> int:
    """The status of HEAD on `bucket` at any S3 endpoint (http:// or https://), path-style."""
    return _call_endpoint(endpoint_url, "HEAD", f"/{bucket}", credentials, timeout=5)[0]


def _call_endpoint(endpoint_url: str, method: str, path: str, credentials: tuple[str, str],
                   timeout: float = 30) -> tuple[int, str]:
    try:
        return s3.request(endpoint_url, method, path, s3.Credentials(*credentials), timeout=timeout)
    except OSError as error:
        raise ObjectStoreError(f"object store {endpoint_url.partition('://')[2]} unreachable ({error}); fix: start "
                               "the platform (strata local up --profile cluster)") from None


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
                               f"({s3.error_code(body) if body else 'access denied'}); fix: use the platform's "
                               f"credentials{source}")
    raise ObjectStoreError(f"bucket {bucket!r} in {endpoint(port)}: HEAD answered {status} ({s3.error_code(body)})")


def object_exists(port: int, bucket: str, key: str, credentials: tuple[str, str]) -> bool:
    return _call(port, "HEAD", f"/{bucket}/{key}", credentials)[0] == 200


def ensure_bucket(port: int, bucket: str, credentials: tuple[str, str]) -> None:
    try:
        s3.ensure_bucket(endpoint(port), bucket, s3.Credentials(*credentials))
    except (s3.S3Error, OSError) as error:
        raise ObjectStoreError(str(error)) from None
