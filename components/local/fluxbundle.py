"""An offline Flux install bundle, rendered from the Flux Go modules, in the layout pulumi-flux expects.

pulumi_flux.get_flux_install(baseurl=..., version=...) downloads
`<baseurl>/download/<version>/manifests.tar.gz`. Upstream builds that tarball with flux2's
manifests/scripts/bundle.sh from release assets; here the assets are rendered from each
controller module's config/ with the toolchain's `kubectl kustomize`, so nothing outside the Go
module proxy is needed. The result is cached by version and settings like the toolchain.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
import tomllib
from pathlib import Path

from .progress import Say, stderr_say, step
from .toolchain import SPEC_FILE, Toolchain, ToolchainError, cache_root, go_env

RELEASE_URL = re.compile(r"https://github\.com/fluxcd/([\w-]+)/releases/download/(v[\w.-]+)/([\w.-]+\.yaml)")


def bundle_settings(path: Path = SPEC_FILE) -> dict:
    with open(path, "rb") as handle:
        return tomllib.load(handle)["flux_bundle"]


def localize_base(kustomization: str) -> tuple[str, dict[str, str]]:
    """Drop the release-download prefix from a base's resources; returns the text and {controller: version}."""
    pins = {match[1]: match[2] for match in RELEASE_URL.finditer(kustomization)}
    return RELEASE_URL.sub(lambda match: match[3], kustomization), pins


def _module_dir(module: str, version: str) -> Path:
    result = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], env=go_env(),
                            capture_output=True, text=True)
    info = json.loads(result.stdout or "{}")
    if result.returncode != 0 or "Dir" not in info:
        raise ToolchainError(f"cannot fetch {module}@{version} for the Flux bundle: "
                             f"{info.get('Error') or result.stderr.strip()}; fix: pick a served version in "
                             f"{SPEC_FILE.name} [flux_bundle]")
    return Path(info["Dir"])


def _kustomize(kubectl: Path, directory: Path) -> str:
    result = subprocess.run([str(kubectl), "kustomize", str(directory)], capture_output=True, text=True)
    if result.returncode != 0:
        raise ToolchainError(f"rendering {directory.name} for the Flux bundle failed: {result.stderr.strip()}")
    return result.stdout


def deterministic_tar_gz(files: dict[str, str]) -> bytes:
    """A .tar.gz of `files` at its root: sorted, zero mtimes and owners, so equal input gives equal bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(files):
            data = files[name].encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0) as compressed:
        compressed.write(raw.getvalue())
    return packed.getvalue()


def render_bundle(toolchain: Toolchain, settings: dict) -> dict[str, str]:
    """File name -> YAML for every file the bundle holds."""
    kubectl = toolchain.bin("kubectl")
    flux2 = _module_dir(settings["module"], settings["version"])
    overrides = settings.get("config_versions", {})
    files: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="strata-flux-bundle-") as tmp:
        work = Path(tmp) / "manifests"
        shutil.copytree(flux2 / "manifests", work)
        work.chmod(0o755)
        for path in work.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        for controller in settings["controllers"]:
            base = work / "bases" / controller
            text, pins = localize_base((base / "kustomization.yaml").read_text())
            if controller not in pins:
                raise ToolchainError(f"flux2 {settings['version']} has no release pin for {controller}")
            (base / "kustomization.yaml").write_text(text)
            version = overrides.get(controller, pins[controller])
            source = _module_dir(f"github.com/fluxcd/{controller}", version)
            (base / f"{controller}.crds.yaml").write_text(_kustomize(kubectl, source / "config" / "crd"))
            (base / f"{controller}.deployment.yaml").write_text(_kustomize(kubectl, source / "config" / "manager"))
            files[f"{controller}.yaml"] = _kustomize(kubectl, base)
        files["rbac.yaml"] = _kustomize(kubectl, work / "rbac")
        files["policies.yaml"] = _kustomize(kubectl, work / "policies")
    return files


def ensure_bundle(toolchain: Toolchain, say: Say = stderr_say) -> Path:
    """The directory to serve as pulumi-flux's `baseurl` (it holds download/<version>/manifests.tar.gz)."""
    settings = bundle_settings()
    # Keyed by what it is rendered from, so a changed `config_versions` renders it again.
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    root = cache_root() / "flux-bundle" / f"{settings['version']}-{key}"
    tarball = root / "download" / settings["version"] / "manifests.tar.gz"
    if tarball.exists():
        say(f"cache hit: flux bundle {settings['version']} ({tarball})")
        return root
    with step(f"rendering the Flux {settings['version']} install bundle from Go modules", say):
        data = deterministic_tar_gz(render_bundle(toolchain, settings))
        tarball.parent.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial")
        partial.write_bytes(data)
        partial.rename(tarball)
    return root
