"""The cluster profile's OCI registry: distribution (the reference registry) built from Go modules.

It listens on the pods' bridge (10.88.0.1:<port>), reachable from the host and from every node, in plain
HTTP on that node-only network: each node's containerd pulls through its registry host configuration
(`<node>/certs.d/<registry>/hosts.toml`), so pods name images `10.88.0.1:<port>/<repository>:<tag>` as
they would any registry's, with no `ctr import` and no `imagePullPolicy: Never`. Its storage is in the
platform's state directory: images survive `down` and `up`.

Images are pushed from the OCI archives `strata image build` writes, with the registry HTTP API
(blob uploads, then the manifest by tag): no Docker or other client needed.
"""

from __future__ import annotations

import http.client
import json
import tarfile
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from .processes import HostProcess
from .realnode import NODE_ADDRESS

PROCESS = "registry"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


class RegistryError(Exception):
    """A push or a registry call failed; the message names the image, the registry and the fix."""


def registry_host(port: int) -> str:
    return f"{NODE_ADDRESS}:{port}"


def build_registry_config(storage: Path, port: int) -> dict:
    return {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True},
                    "maintenance": {"uploadpurging": {"enabled": False}}},
        # The bridge address only: the registry is for the host and the nodes, not for the host's other networks.
        "http": {"addr": registry_host(port)},
    }


def registry_process(binary: Path, config: Path) -> HostProcess:
    # OTEL_TRACES_EXPORTER=none: v3 otherwise tries to export traces to localhost:4318 and logs each failure.
    return HostProcess(PROCESS, [str(binary), "serve", str(config)], env={"OTEL_TRACES_EXPORTER": "none"})


def build_containerd_hosts(port: int) -> str:
    """containerd's hosts.toml for the registry: plain HTTP on the node network, pull and resolve only."""
    server = f"http://{registry_host(port)}"
    return f'server = "{server}"\n\n[host."{server}"]\n  capabilities = ["pull", "resolve"]\n'


def write_containerd_hosts(certs_dir: Path, port: int) -> None:
    directory = certs_dir / registry_host(port)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "hosts.toml").write_text(build_containerd_hosts(port))


def split_reference(reference: str) -> tuple[str, str, str]:
    """`host:port/repo/name:tag` -> (host:port, repo/name, tag)."""
    host, _, rest = reference.partition("/")
    repository, _, tag = rest.rpartition(":")
    if not host or not repository or not tag or "/" in tag:
        raise RegistryError(f"image reference {reference!r}: expected HOST:PORT/REPOSITORY:TAG")
    return host, repository, tag


def _request(host: str, method: str, path: str, body=None, headers: dict | None = None,
             ) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(host, timeout=300)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    except OSError as error:
        raise RegistryError(f"registry {host} unreachable ({error}); fix: start the platform "
                            "(strata local up --profile cluster)") from None
    finally:
        connection.close()


def _error_text(body: bytes) -> str:
    try:
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in json.loads(body)["errors"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]


def manifest_exists(reference: str) -> bool:
    host, repository, tag = split_reference(reference)
    status, _, _ = _request(host, "HEAD", f"/v2/{repository}/manifests/{tag}",
                            headers={"Accept": MANIFEST_TYPE})
    return status == 200


def push(archive: Path, reference: str) -> str:
    """Push the one image of an OCI archive as `reference`; returns its manifest digest."""
    host, repository, tag = split_reference(reference)
    with tarfile.open(archive) as tar:
        def read(name: str) -> bytes:
            return tar.extractfile(name).read()

        (entry,) = json.loads(read("index.json"))["manifests"]
        manifest_digest = entry["digest"]
        manifest = read(f"blobs/sha256/{manifest_digest.split(':')[1]}")
        parsed = json.loads(manifest)
        for blob in [parsed["config"], *parsed["layers"]]:
            digest = blob["digest"]
            status, _, _ = _request(host, "HEAD", f"/v2/{repository}/blobs/{digest}")
            if status == 200:
                continue
            status, headers, body = _request(host, "POST", f"/v2/{repository}/blobs/uploads/")
            if status != 202:
                raise RegistryError(f"pushing {reference}: starting an upload answered {status} "
                                    f"({_error_text(body)})")
            location = urljoin(f"http://{host}/v2/{repository}/blobs/uploads/", headers["location"])
            target = urlsplit(location)
            path = f"{target.path}?{target.query + '&' if target.query else ''}digest={digest}"
            member = tar.getmember(f"blobs/sha256/{digest.split(':')[1]}")
            status, _, body = _request(target.netloc or host, "PUT", path, body=tar.extractfile(member),
                                       headers={"Content-Type": "application/octet-stream",
                                                "Content-Length": str(member.size)})
            if status != 201:
                raise RegistryError(f"pushing {reference}: blob {digest} answered {status} ({_error_text(body)})")
    status, headers, body = _request(host, "PUT", f"/v2/{repository}/manifests/{tag}", body=manifest,
                                     headers={"Content-Type": MANIFEST_TYPE})
    if status != 201:
        raise RegistryError(f"pushing {reference}: the manifest answered {status} ({_error_text(body)})")
    return headers.get("docker-content-digest", manifest_digest)
