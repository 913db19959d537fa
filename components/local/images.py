"""Container images without a registry: built from Debian's tools, loaded straight into a node's containerd.

No registry is reachable here, so images are written as OCI archives and imported with
`ctr -n k8s.io images import`; pods use them with `imagePullPolicy: IfNotPresent` or `Never`.
- the pause image (every pod's sandbox) is a static C program compiled with the host's gcc;
- the operator image follows `operator/Dockerfile`: Debian bookworm (mmdebstrap) with python3,
  git, openssh-client and ca-certificates; the project installed into /opt/strata from wheels built
  on the host at the versions of the tested virtualenv (pip in the chroot cannot reach PyPI); user
  65532. A second layer holds what updates run: the toolchain's pulumi CLI and hosts and the user's
  Python language host in /usr/local/bin, the user's provider plugins in /opt/pulumi/plugins (the
  image's PULUMI_HOME), since nothing in a cluster can download them.
Archives are cached in `$STRATA_CACHE/images/`, keyed by a digest of everything that goes in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from . import preflight
from .progress import Say, format_seconds, stderr_say, step
from .realnode import PAUSE_IMAGE
from .toolchain import Toolchain, cache_root

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_REPOSITORY = "strata.local/strata-operator"
OPERATOR_USER = 65532
DEBIAN_SUITE = "bookworm"
OPERATOR_DEBIAN_PACKAGES = ("python3", "python3-venv", "git", "openssh-client", "ca-certificates")
# What the host trusts (a TLS-inspecting proxy's CA included) replaces Debian's bundle in the image, as in Flux's
# images: updates in workspace pods fetch their programs' dependencies (uv, git over HTTPS) as the host would.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# What Dockerfile's `COPY --from=pulumi /pulumi/bin/` gives: the CLI and the hosts updates start.
PULUMI_BINARIES = ("pulumi", "pulumi-language-yaml", "pulumi-resource-pulumi-python")
OPERATOR_SOURCES = ("pyproject.toml", "components", "operator")
# The image's Pulumi home: its plugins/ is the operator's --plugin-cache default and what a workspace
# pod's agent links into every Stack's own PULUMI_HOME. Outside HOME, which the operator's pods mount over.
IMAGE_PULUMI_HOME = "/opt/pulumi"

PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction quit = {.sa_handler = stop}, child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &quit, 0); sigaction(SIGTERM, &quit, 0); sigaction(SIGCHLD, &child, 0);
    for (;;) pause();
}
"""


class ImageError(Exception):
    """An image could not be built or loaded; the message names the step, its output and the fix."""


@dataclasses.dataclass(frozen=True)
class ImageArchive:
    name: str
    """Full reference, e.g. strata.local/strata-operator:3f2a9c1d0b4e."""
    path: Path
    """The OCI archive (`ctr images import` reads it)."""


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _blob(tar: tarfile.TarFile, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def build_image_config(*, entrypoint: list[str], env: dict[str, str], user: str, workdir: str,
                       layer_digests: Sequence[str], ports: Iterable[int] = ()) -> dict:
    """`layer_digests`: each uncompressed layer's sha256, bottom first."""
    return {
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": [f"{k}={v}" for k, v in env.items()], "User": user,
                   "WorkingDir": workdir, "ExposedPorts": {f"{port}/tcp": {} for port in ports}},
        "rootfs": {"type": "layers", "diff_ids": list(layer_digests)},
        "history": [{"created_by": "strata image build"} for _ in layer_digests],
    }


def write_oci_archive(layers: Sequence[Path], config: dict, name: str, out: Path) -> None:
    """Uncompressed layers (bottom first), their config and an index naming the image, as an OCI image
    layout tarball. A layer that did not change keeps its digest: a registry that has it is not sent it again."""
    tmp = out.with_name(out.name + ".partial")
    descriptors = []
    with tarfile.open(tmp, "w") as tar:
        for layer in layers:
            layer_digest = _sha256_file(layer)
            tar.add(layer, arcname=f"blobs/sha256/{layer_digest}")
            descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                "digest": f"sha256:{layer_digest}", "size": layer.stat().st_size})
        config_blob = _blob(tar, json.dumps(config, sort_keys=True).encode())
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_blob},
                    "layers": descriptors}
        manifest_blob = _blob(tar, json.dumps(manifest, sort_keys=True).encode())
        index = {"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_blob,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}
        _blob_free(tar, "index.json", json.dumps(index).encode())
        _blob_free(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    tmp.rename(out)


def _blob_free(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _check(argv: list[str], what: str, fix: str, **kwargs) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode != 0:
        last = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ImageError(f"{what} failed: {' | '.join(last) or 'no output'}; fix: {fix}")


def images_dir() -> Path:
    path = cache_root() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_pause_image(say: Say = stderr_say) -> ImageArchive:
    key = hashlib.sha256(PAUSE_C.encode()).hexdigest()[:12]
    name = PAUSE_IMAGE
    out = images_dir() / f"pause-{key}.oci.tar"
    if out.exists():
        return ImageArchive(name, out)
    if shutil.which("gcc") is None:
        raise ImageError("the pause image needs gcc (static C): apt-get install -y gcc libc6-dev")
    with tempfile.TemporaryDirectory(prefix="strata-pause-") as tmp:
        source, binary, layer = Path(tmp, "pause.c"), Path(tmp, "pause"), Path(tmp, "layer.tar")
        source.write_text(PAUSE_C)
        _check(["gcc", "-static", "-Os", "-s", "-o", str(binary), str(source)], "compiling the pause program",
               "apt-get install -y gcc libc6-dev")
        with tarfile.open(layer, "w") as tar:
            tar.add(binary, arcname="pause")
        config = build_image_config(entrypoint=["/pause"], env={}, user="65535", workdir="/",
                                    layer_digests=[f"sha256:{_sha256_file(layer)}"])
        write_oci_archive([layer], config, name, out)
    say(f"  pause image built: {name}")
    return ImageArchive(name, out)


def build_binary_image(binary: Path, repository: str, tag: str, user: int = 65532, files: dict[str, Path] | None = None,
                       say: Say = stderr_say) -> ImageArchive:
    """An image of one static binary at /<its name>, run as `user`: how upstream ships CoreDNS and Flux's
    controllers (distroless, non-root). `files`: more files by path in the image (a CA bundle).
    Cached by the digests of what goes in."""
    name = f"{repository}:{tag}"
    extra = dict(sorted((files or {}).items()))
    contents = " ".join(f"{path}={_sha256_file(source)}" for path, source in extra.items())
    key = hashlib.sha256(f"{name} {user} {_sha256_file(binary)} {contents}".encode()).hexdigest()[:12]
    out = images_dir() / f"{repository.rsplit('/', 1)[-1]}-{key}.oci.tar"
    if out.exists():
        return ImageArchive(name, out)
    with tempfile.TemporaryDirectory(prefix="strata-image-") as tmp:
        layer = Path(tmp, "layer.tar")
        with tarfile.open(layer, "w") as tar:
            for arcname, source in {binary.name: binary, **{p.lstrip("/"): s for p, s in extra.items()}}.items():
                info = tar.gettarinfo(str(source.resolve()), arcname=arcname)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(source, "rb") as handle:
                    tar.addfile(info, handle)
        config = build_image_config(entrypoint=[f"/{binary.name}"], env={}, user=f"{user}:{user}", workdir="/",
                                    layer_digests=[f"sha256:{_sha256_file(layer)}"])
        write_oci_archive([layer], config, name, out)
    say(f"  image {name} built from {binary} ({out.stat().st_size // (1 << 20)} MiB)")
    return ImageArchive(name, out)


@dataclasses.dataclass(frozen=True)
class PulumiInstall:
    """What of the user's Pulumi install the operator image carries: in a cluster nothing can download it."""

    language_hosts: tuple[Path, ...] = ()
    """pulumi-language-python and its helper pulumi-language-python-exec."""
    plugins: tuple[Path, ...] = ()
    """Provider plugin install directories, e.g. ~/.pulumi/plugins/resource-kubernetes-v4.34.2."""
    missing: tuple[str, ...] = ()
    """What the layers need and the install lacks, each with the command that installs it (the preflight's)."""


def user_pulumi_install() -> PulumiInstall:
    """The Python language host and the layers' provider plugins (preflight.PLUGINS) of this machine."""
    host = ambient_python_host()
    return PulumiInstall(language_hosts=tuple(sorted(host.parent.glob("pulumi-language-python*"))) if host else (),
                         plugins=tuple(preflight.plugin_dirs()),
                         missing=tuple(preflight.missing_dev_stack_requirements()))


def build_missing_install_message(missing: Sequence[str]) -> str:
    return "\n".join([
        "the operator image runs every layer in the cluster, where nothing can be downloaded, so it carries the "
        "Python language host and the provider plugins of this machine's Pulumi install; missing:",
        *(f"  - {item}" for item in missing),
        "fix: install them, then run `strata image build` again"])


def build_pulumi_layer_files(binaries: Mapping[str, Path], install: PulumiInstall) -> dict[str, Path]:
    """Where each file of the image's Pulumi layer comes from, by its path in the image: the CLI and the
    language hosts on PATH (/usr/local/bin, beside the CLI, where it looks first), each plugin install
    directory under the image's PULUMI_HOME as `pulumi plugin install` lays it out."""
    files = {f"usr/local/bin/{name}": path for name, path in binaries.items()}
    files.update({f"usr/local/bin/{host.name}": host for host in install.language_hosts})
    plugins = f"{IMAGE_PULUMI_HOME.lstrip('/')}/plugins"
    for directory in install.plugins:
        for file in sorted(p for p in directory.rglob("*") if p.is_file()):
            files[f"{plugins}/{directory.name}/{file.relative_to(directory)}"] = file
    return files


def _fingerprint(files: Mapping[str, Path]) -> str:
    """Where each file goes and its source's path, size and modification time: reading half a gigabyte of
    binaries to learn that nothing changed would cost seconds at every build."""
    digest = hashlib.sha256()
    for arcname, source in sorted(files.items()):
        status = source.stat()
        digest.update(f"{arcname} {source.resolve()} {status.st_size} {status.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:12]


def _pulumi_layer(files: Mapping[str, Path], say: Say) -> Path:
    """The Pulumi layer as a tarball, cached by its fingerprint: a change to the project alone rebuilds the
    other layer only. Root-owned, readable and runnable by the image's user (plugins install 0700)."""
    out = images_dir() / f"pulumi-layer-{_fingerprint(files)}.tar"
    if out.exists():
        return out
    partial = out.with_name(out.name + ".partial")
    with step(f"writing the Pulumi layer ({len(files)} files: the CLI, language hosts, provider plugins)", say):
        with tarfile.open(partial, "w") as tar:
            for directory in sorted({str(parent) for name in files for parent in Path(name).parents} - {"."}):
                info = tarfile.TarInfo(directory)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            for arcname, source in sorted(files.items()):
                info = tar.gettarinfo(str(source.resolve()), arcname=arcname)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o755
                with open(source, "rb") as handle:
                    tar.addfile(info, handle)
        partial.rename(out)
    for stale in images_dir().glob("pulumi-layer-*.tar"):  # half a gigabyte each: the newest only
        if stale != out:
            stale.unlink()
    return out


def operator_image_key(pulumi_layer_key: str) -> str:
    """Digest of everything the operator image is made of: sources, pinned deps, packages, the Pulumi layer."""
    digest = hashlib.sha256()
    for top in OPERATOR_SOURCES:
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted(
            p for p in (ROOT / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for path in paths:
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    digest.update(_frozen_requirements().encode())
    digest.update(pulumi_layer_key.encode() + " ".join(OPERATOR_DEBIAN_PACKAGES).encode() + DEBIAN_SUITE.encode())
    if HOST_CA_BUNDLE.is_file():
        digest.update(HOST_CA_BUNDLE.read_bytes())
    return digest.hexdigest()[:12]


def _frozen_requirements() -> str:
    """The tested virtualenv's versions (this project excluded): the image runs exactly what was tested."""
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True).stdout
    return "\n".join(line for line in out.splitlines() if line and not line.startswith(("-e ", "strata")))


def _base_rootfs(say: Say) -> Path:
    """A Debian root filesystem with the operator's packages, cached as a tarball (mmdebstrap, ~1 min)."""
    key = hashlib.sha256(f"{DEBIAN_SUITE} {' '.join(OPERATOR_DEBIAN_PACKAGES)}".encode()).hexdigest()[:12]
    out = images_dir() / f"debian-{DEBIAN_SUITE}-{key}.tar"
    if out.exists():
        return out
    if shutil.which("mmdebstrap") is None:
        raise ImageError("building the operator image needs mmdebstrap: apt-get install -y mmdebstrap")
    with step(f"creating a Debian {DEBIAN_SUITE} root filesystem with {', '.join(OPERATOR_DEBIAN_PACKAGES)}", say):
        partial = out.with_name(out.name + ".partial")
        _check(["mmdebstrap", "--variant=minbase", "--mode=root", "--format=tar",
                f"--include={','.join(OPERATOR_DEBIAN_PACKAGES)}", "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-exclude=/usr/share/man/*", DEBIAN_SUITE, str(partial)],
               "mmdebstrap", "check that deb.debian.org is reachable (apt-get update works)")
        partial.rename(out)
    return out


def build_operator_image(toolchain: Toolchain, install: PulumiInstall = PulumiInstall(),
                         say: Say = stderr_say) -> ImageArchive:
    """The operator image as an OCI archive (cached by content: a rebuild costs nothing when nothing changed).

    `install`: the language host and plugins of the user's Pulumi install to carry (user_pulumi_install();
    the toolchain builds neither). Without them the image runs YAML programs and inline Python only."""
    # Here, not at the top: the strata CLI imports this module at every start, and the executor is heavy.
    from strata_operator.engine.process.executor import IMAGE_PULUMI_VERSION
    if not (ROOT / "pyproject.toml").exists():
        raise ImageError(f"the operator image is built from a checkout of this project (no pyproject.toml in {ROOT}); "
                         "fix: run `strata image build` from the repository's virtualenv (make image)")
    pulumi_files = build_pulumi_layer_files({binary: toolchain.bin(binary) for binary in PULUMI_BINARIES}, install)
    key = operator_image_key(_fingerprint(pulumi_files))
    name = f"{OPERATOR_REPOSITORY}:{key}"
    out = images_dir() / f"strata-operator-{key}.oci.tar"
    if out.exists():
        say(f"  operator image up to date: {name}")
        return ImageArchive(name, out)
    started = time.monotonic()
    base = _base_rootfs(say)
    pulumi_layer = _pulumi_layer(pulumi_files, say)
    with tempfile.TemporaryDirectory(prefix="strata-image-") as tmp:
        rootfs, wheels = Path(tmp, "rootfs"), Path(tmp, "rootfs", "tmp", "wheels")
        rootfs.mkdir()
        _check(["tar", "-xf", str(base), "-C", str(rootfs)], "unpacking the base root filesystem", "free disk space")
        wheels.mkdir(parents=True)
        constraints = Path(tmp, "constraints.txt")
        constraints.write_text(_frozen_requirements() + "\n")
        with step("building wheels of the project and its pinned dependencies on the host", say):
            _check([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                    "--wheel-dir", str(wheels), "-c", str(constraints), f"{ROOT}[operator]"],
                   "pip wheel", "check that PyPI is reachable")
        with step("installing them into /opt/strata inside the image", say):
            _check(["chroot", str(rootfs), "python3", "-m", "venv", "/opt/strata"], "python3 -m venv", "rebuild")
            # Compiled to bytecode here, once: the image's root filesystem is read-only in every pod
            # (and PYTHONDONTWRITEBYTECODE is set), so without .pyc files every workspace agent, fork server
            # and operator start compiled each module it imports again (0.4 s of CPU per agent, times 50 pods).
            _check(["chroot", str(rootfs), "/opt/strata/bin/pip", "install", "--quiet", "--no-index",
                    "--disable-pip-version-check", "--find-links", "/tmp/wheels", "strata[operator]"],
                   "pip install in the image", "see the wheels built above")
        shutil.rmtree(wheels)
        _check(["chroot", str(rootfs), "useradd", "--create-home", "--uid", str(OPERATOR_USER), "strata"],
               "useradd", "rebuild")
        if HOST_CA_BUNDLE.is_file():
            shutil.copyfile(HOST_CA_BUNDLE, rootfs / HOST_CA_BUNDLE.relative_to("/"))
        layer = Path(tmp, "layer.tar")
        with step("writing the image layer", say):
            _check(["tar", "--numeric-owner", "--xattrs", "-cf", str(layer), "-C", str(rootfs), "."],
                   "tar", "free disk space")
        layers = [layer, pulumi_layer]
        config = build_image_config(
            entrypoint=["python", "-m", "strata_operator"], user=str(OPERATOR_USER), workdir="/home/strata",
            env={"PATH": "/opt/strata/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/home/strata",
                 "PULUMI_HOME": IMAGE_PULUMI_HOME,
                 "STRATA_OPERATOR_STATE": "/home/strata/state", "PYTHONDONTWRITEBYTECODE": "1",
                 IMAGE_PULUMI_VERSION: _cli_version(toolchain.bin("pulumi"))},
            layer_digests=[f"sha256:{_sha256_file(path)}" for path in layers], ports=(8383, 8384))
        with step("writing the image archive", say):
            write_oci_archive(layers, config, name, out)
    for stale in images_dir().glob("strata-operator-*.oci.tar"):  # a gigabyte each: keep the newest only
        if stale != out:
            stale.unlink()
    say(f"operator image {name} built in {format_seconds(time.monotonic() - started)} "
        f"({out.stat().st_size // (1 << 20)} MiB): {out}")
    return ImageArchive(name, out)


def _cli_version(pulumi: Path) -> str:
    """What `pulumi version` prints for the CLI the image carries, asked once here rather than in every pod."""
    done = subprocess.run([str(pulumi), "version"], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "PULUMI_SKIP_UPDATE_CHECK": "true"})
    if done.returncode != 0 or not done.stdout.strip():
        raise ImageError(f"`{pulumi} version` failed: {(done.stderr or done.stdout).strip()[-300:]}; "
                         "fix: rebuild it with `strata local toolchain --rebuild pulumi`")
    return done.stdout.strip()


def load_image(archive: ImageArchive, containerd_socket: Path) -> None:
    """Import into the node's containerd, in the namespace kubelet's CRI uses (k8s.io)."""
    ctr = ["ctr", "--address", str(containerd_socket), "-n", "k8s.io"]
    present = subprocess.run([*ctr, "images", "ls", "-q", f"name=={archive.name}"], capture_output=True,
                             text=True, check=False).stdout.split()
    if archive.name in present:
        return
    _check([*ctr, "images", "import", str(archive.path)], f"importing {archive.name}",
           f"check the node's containerd ({containerd_socket})")


def ambient_python_host() -> Path | None:
    """The user's pulumi-language-python, if any (`make setup` does not build one)."""
    found = shutil.which("pulumi-language-python") or (preflight.pulumi_home() / "bin" / "pulumi-language-python")
    return Path(found) if Path(found).exists() else None
