"""The local platform's toolchain: Go binaries built from Go modules, cached outside the repo by version.

Each tool in toolchain.toml is built in a throw-away wrapper module (so upstream `replace`
directives can be repeated and versions pinned), then installed into
``$STRATA_CACHE/toolchain/<name>-<version>/`` with a manifest of every file's size and sha256.
An entry with a manifest is reused; a file that no longer matches its manifest is reported as a
corrupt entry with the command that rebuilds it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from .progress import Say, format_seconds, stderr_say, step, tail

SPEC_FILE = Path(__file__).with_name("toolchain.toml")
MANIFEST = "strata-toolchain.json"
MIN_GO = (1, 26)


class ToolchainError(Exception):
    """A toolchain problem, phrased as one line naming the cause and the fix."""


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    name: str
    version: str
    module: str
    packages: dict[str, str]
    get: tuple[str, ...] = ()
    replaces: dict[str, str] = dataclasses.field(default_factory=dict)
    staging: str | None = None
    tags: str = ""
    ldflags: tuple[str, ...] = ()
    copy: dict[str, str] = dataclasses.field(default_factory=dict)
    kwok_stages: tuple[str, ...] = ()
    crds: tuple[str, ...] = ()
    profile: str = ""
    """The platform profile that needs this tool ("" = every platform): built on first use of that profile,
    not by `make setup`."""

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def fingerprint(self) -> str:
        """Changes whenever anything about how the tool is built changes."""
        settings = {k: v for k, v in dataclasses.asdict(self).items() if k != "profile"}  # when, not how
        blob = json.dumps({**settings, "strip": STRIP_LDFLAGS}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def load_specs(path: Path = SPEC_FILE) -> dict[str, ToolSpec]:
    with open(path, "rb") as handle:
        raw = tomllib.load(handle)
    specs = {}
    for name, fields in raw["tools"].items():
        # `like = "other"`: the other tool's build settings (module, version, flags) with these fields on top.
        if "like" in fields:
            base = {k: v for k, v in raw["tools"][fields["like"]].items() if k not in ("packages", "copy", "profile")}
            fields = {**base, **{k: v for k, v in fields.items() if k != "like"}}
        tuples = {k: tuple(v) for k, v in fields.items() if isinstance(v, list)}
        specs[name] = ToolSpec(name=name, **{**fields, **tuples})
    return specs


def default_tools(specs: dict[str, ToolSpec]) -> list[str]:
    """What `make setup` builds and every platform uses: the tools of no particular profile."""
    return [name for name, spec in specs.items() if not spec.profile]


def profile_tools(profile: str, specs: dict[str, ToolSpec] | None = None) -> list[str]:
    """Every tool a platform of `profile` runs: the default ones and its own."""
    specs = specs if specs is not None else load_specs()
    return [name for name, spec in specs.items() if spec.profile in ("", profile)]


def cache_root() -> Path:
    return Path(os.environ.get("STRATA_CACHE") or Path.home() / ".cache" / "strata")


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """Built tool entries, by tool name."""

    entries: dict[str, Path]

    def bin(self, binary: str) -> Path:
        for entry in self.entries.values():
            candidate = entry / "bin" / binary
            if candidate.exists():
                return candidate
        raise ToolchainError(f"no toolchain binary named {binary!r}: run `strata local toolchain`")

    def dir(self, tool: str) -> Path:
        return self.entries[tool]

    @property
    def bin_dirs(self) -> list[Path]:
        return [entry / "bin" for entry in self.entries.values()]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_manifest(entry: Path, spec: ToolSpec, build_seconds: float = 0.0, phases: dict | None = None) -> None:
    files = {}
    for path in sorted(p for p in entry.rglob("*") if p.is_file() and p.name != MANIFEST):
        stat = path.stat()
        files[str(path.relative_to(entry))] = {
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "sha256": _sha256(path),
        }
    manifest = {"tool": spec.name, "version": spec.version, "fingerprint": spec.fingerprint,
                "build_seconds": round(build_seconds, 1), "phases": phases or {}, "files": files}
    (entry / MANIFEST).write_text(json.dumps(manifest, indent=1))


def check_entry(entry: Path, spec: ToolSpec) -> str | None:
    """None when the entry is complete and intact, else why it must be rebuilt.

    Raises ToolchainError when a file was changed after it was built: that is corruption,
    not a missing build, and the user should know.
    """
    manifest_path = entry / MANIFEST
    if not manifest_path.exists():
        return "not built yet" if not entry.exists() else "an earlier build did not finish"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError) as error:
        raise ToolchainError(
            f"toolchain entry {entry} is corrupt (unreadable manifest: {error}); "
            f"fix: strata local toolchain --rebuild {spec.name}"
        ) from None
    if manifest.get("fingerprint") != spec.fingerprint:
        return "its build settings changed"
    for relative, recorded in files.items():
        path = entry / relative
        if not path.exists():
            problem = "is missing"
        else:
            stat = path.stat()
            if stat.st_size != recorded["size"]:
                problem = f"has size {stat.st_size}, expected {recorded['size']}"
            elif stat.st_mtime_ns != recorded["mtime_ns"] and _sha256(path) != recorded["sha256"]:
                problem = "does not match its recorded sha256"
            else:
                continue
        raise ToolchainError(
            f"toolchain entry {entry} is corrupt: {relative} {problem}; "
            f"fix: strata local toolchain --rebuild {spec.name}"
        )
    return None


def _go_version() -> tuple[int, int]:
    go = shutil.which("go")
    if go is None:
        raise ToolchainError(
            "the Go toolchain is not installed (no `go` on PATH); fix: install Go "
            f">= {MIN_GO[0]}.{MIN_GO[1]} (Debian: apt-get install golang, or the official tarball) and re-run make setup"
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
    match = re.match(r"go(\d+)\.(\d+)", out.strip())
    if not match:
        raise ToolchainError(f"cannot read the Go version (`go env GOVERSION` said {out.strip()!r}); fix: reinstall Go")
    version = (int(match[1]), int(match[2]))
    if version < MIN_GO:
        raise ToolchainError(
            f"Go {out.strip()} is too old: these modules need Go >= {MIN_GO[0]}.{MIN_GO[1]}; fix: install a newer Go"
        )
    return version


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "GOWORK": "off"})
    return env


# No symbol table and no DWARF: nobody debugs these binaries, and DWARF is the slowest part of linking
# a binary the size of kube-apiserver (the manifest records each link's time).
STRIP_LDFLAGS = ("-s", "-w")
_PACKAGE_LINE = re.compile(r"^[\w.~+-]+(/[\w.~+-]+)*$")


def default_binary_name(import_path: str) -> str:
    """The name `go build -o DIR/` gives a main package: its last element, or the one before a /vN."""
    elements = import_path.split("/")
    if len(elements) > 1 and re.fullmatch(r"v[2-9]|v[1-9]\d+", elements[-1]):
        return elements[-2]
    return elements[-1]


def link_seconds(trace: Path) -> dict[str, float]:
    """Seconds each link took, by package, from a `go build -debug-trace` file ({} if there is none)."""
    try:
        events = json.loads(trace.read_text())
    except (OSError, ValueError):
        return {}
    began: dict[tuple[int, str], float] = {}
    spans: dict[str, float] = {}
    for event in events:
        match = re.fullmatch(r"Executing action \(link (.+)\)", event.get("name", ""))
        if not match:
            continue
        key = (event.get("tid", 0), match[1])
        if event.get("ph") == "B":
            began[key] = event["ts"]
        elif event.get("ph") == "E" and key in began:
            spans[match[1]] = round((event["ts"] - began.pop(key)) / 1e6, 1)
    return spans


class CompileProgress:
    """Counts the packages `go build -v` reports compiled, for progress lines that say how far it got."""

    def __init__(self, total: int):
        self.total = total
        self.compiled = 0

    def saw(self, line: str) -> None:
        if _PACKAGE_LINE.match(line.strip()):
            self.compiled += 1

    def line(self) -> str:
        if not self.total:
            return f"{self.compiled} packages compiled"
        percent = min(100, round(100 * self.compiled / self.total))
        return f"{self.compiled} of {self.total} packages compiled ({percent}%), cached ones not counted"


class _Build:
    """One wrapper-module build, logging every command into one file."""

    def __init__(self, spec: ToolSpec, workdir: Path, log: Path):
        self.spec = spec
        self.workdir = workdir
        self.log = log
        self.env = go_env()

    def go(self, *args: str) -> str:
        with open(self.log, "a") as handle:
            handle.write(f"$ go {' '.join(args)}\n")
            handle.flush()
            result = subprocess.run(
                ["go", *args], cwd=self.workdir, env=self.env, stdout=subprocess.PIPE, stderr=handle, text=True
            )
            handle.write(result.stdout)
        if result.returncode != 0:
            raise ToolchainError(self._explain(args))
        return result.stdout

    def go_streaming(self, args: list[str], progress: CompileProgress) -> None:
        """Run go with its stderr counted by `progress` as it arrives (and logged)."""
        with open(self.log, "a") as handle:
            handle.write(f"$ go {' '.join(args)}\n")
            handle.flush()
            process = subprocess.Popen(["go", *args], cwd=self.workdir, env=self.env, stdout=handle,
                                       stderr=subprocess.PIPE, text=True)
            for line in process.stderr:
                handle.write(line)
                progress.saw(line)
            code = process.wait()
        if code != 0:
            raise ToolchainError(self._explain(tuple(args)))

    def _explain(self, args: tuple[str, ...]) -> str:
        text = tail(self.log, 40)
        refused = re.search(r"([\w./-]+@v[\w.+-]+)[^\n]*(403|not available|Forbidden)", text)
        if refused:
            return (
                f"building {self.spec.key}: the Go module proxy refuses {refused[1]} (final); "
                f"fix: pick a served version in {SPEC_FILE.name} (log: {self.log})"
            )
        last = [line for line in text.splitlines() if line.strip()][-1:] or ["(no output)"]
        return f"building {self.spec.key}: `go {' '.join(args[:2])}` failed: {last[0].strip()} (log: {self.log})"

    def module_dir(self, module_at_version: str) -> Path:
        out = self.go("mod", "download", "-json", module_at_version)
        return Path(json.loads(out)["Dir"])

    @property
    def tag_flags(self) -> list[str]:
        return ["-tags", self.spec.tags] if self.spec.tags else []


def _staging_replaces(spec: ToolSpec, build: _Build) -> dict[str, str]:
    """Every `k8s.io/x => ./staging/...` of upstream's go.mod, pinned to the staging version instead."""
    gomod = json.loads(build.go("mod", "download", "-json", f"{spec.module}@{spec.version}"))["GoMod"]
    staged = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", Path(gomod).read_text(), re.M)
    return {module: f"{module} {spec.staging}" for module in staged}


def render_kustomization(directory: Path) -> list[str]:
    """Flatten a kustomization that only lists resources (kwok's stage sets) into YAML documents."""
    import yaml

    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - {"apiVersion", "kind", "resources"}
    if unsupported:
        raise ToolchainError(f"{directory}/kustomization.yaml uses {sorted(unsupported)}: only `resources` is supported")
    documents: list[str] = []
    for resource in kustomization.get("resources", []):
        target = (directory / resource).resolve()
        if target.is_dir():
            documents.extend(render_kustomization(target))
        else:
            documents.append(target.read_text().strip())
    return documents


@dataclasses.dataclass
class _Prepared:
    """A wrapper module whose dependencies are downloaded: everything a compile needs but CPU."""

    spec: ToolSpec
    build: _Build
    packages: list[str]
    package_count: int
    download_seconds: float


def _prepare(spec: ToolSpec, say: Say) -> _Prepared:
    """The download phase: wrapper module, replacements, `go get` and the package list."""
    logs = cache_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{spec.key}.log"
    log.write_text("")
    started = time.monotonic()
    build = _Build(spec, Path(tempfile.mkdtemp(prefix=f"strata-build-{spec.name}-")), log)
    major, minor = _go_version()
    build.go("mod", "init", f"strata.local/toolchain/{spec.name}")
    build.go("mod", "edit", f"-go={major}.{minor}.0")
    replaces = dict(spec.replaces)
    if spec.staging:
        replaces.update(_staging_replaces(spec, build))
    if replaces:
        build.go("mod", "edit", *[f"-replace={old}={new.replace(' ', '@')}" for old, new in sorted(replaces.items())])
    packages = [spec.module if pkg == "." else f"{spec.module}/{pkg}" for pkg in spec.packages]
    build.go("get", *[f"{pkg}@{spec.version}" for pkg in packages], *spec.get)
    package_count = len(build.go("list", "-deps", *build.tag_flags, *packages).split())
    seconds = time.monotonic() - started
    say(f"  modules for {spec.key} downloaded in {format_seconds(seconds)} ({package_count} packages to build)")
    return _Prepared(spec, build, packages, package_count, seconds)


def _compile(prepared: _Prepared, entry: Path, say: Say) -> dict[str, object]:
    """The compile phase: one `go build` for every binary of the entry, then the entry's extra files."""
    spec, build = prepared.spec, prepared.build
    staging_entry = entry.with_name(entry.name + ".partial")
    shutil.rmtree(staging_entry, ignore_errors=True)
    (staging_entry / "bin").mkdir(parents=True)
    trace = build.log.with_suffix(".trace.json")
    ldflags = " ".join([*STRIP_LDFLAGS, *(flag.format(version=spec.version) for flag in spec.ldflags)])
    progress = CompileProgress(prepared.package_count)
    started = time.monotonic()
    # One invocation: dependencies shared by several binaries compile once, and one binary links
    # while the next one's packages still compile.
    with step(f"compiling {spec.key}: {', '.join(spec.packages.values())}", say, detail=progress.line):
        build.go_streaming(["build", "-v", "-trimpath", *build.tag_flags, "-ldflags", ldflags,
                            f"-debug-trace={trace}", "-o", f"{staging_entry / 'bin'}/", *prepared.packages], progress)
    compile_seconds = time.monotonic() - started
    links = link_seconds(trace)
    for package, binary in zip(prepared.packages, spec.packages.values()):
        default = staging_entry / "bin" / default_binary_name(package)
        if default.name != binary:
            default.rename(staging_entry / "bin" / binary)
    source = build.module_dir(f"{spec.module}@{spec.version}")
    for origin, dest in spec.copy.items():
        module_at_version, _, relative = origin.partition(":")
        target = staging_entry / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(build.module_dir(module_at_version) / relative, target)
        target.chmod(0o755)
    for stages in spec.kwok_stages:
        documents = render_kustomization(source / stages)
        (staging_entry / "stages.yaml").write_text("\n---\n".join(documents) + "\n")
    for crd_dir in spec.crds:
        target = staging_entry / "crds"
        target.mkdir(exist_ok=True)
        for crd in sorted((source / crd_dir).glob("*.yaml")):
            if crd.name != "kustomization.yaml":
                shutil.copyfile(crd, target / crd.name)
    phases = {
        "download_seconds": round(prepared.download_seconds, 1),
        "compile_seconds": round(compile_seconds, 1),
        "packages_compiled": progress.compiled,
        "link_seconds": {binary: links[package] for package, binary in zip(prepared.packages, spec.packages.values())
                         if package in links},
    }
    _write_manifest(staging_entry, spec, prepared.download_seconds + compile_seconds, phases)
    shutil.rmtree(entry, ignore_errors=True)
    staging_entry.rename(entry)
    return phases


def format_phases(key: str, phases: dict) -> str:
    links = ", ".join(f"{binary} {seconds:.0f}s" for binary, seconds in phases.get("link_seconds", {}).items())
    return (f"  {key}: modules {format_seconds(phases['download_seconds'])}, compile and link "
            f"{format_seconds(phases['compile_seconds'])} ({phases['packages_compiled']} packages"
            f"{'; links: ' + links if links else ''})")


def ensure(
    names: list[str] | None = None, rebuild: tuple[str, ...] = (), say: Say = stderr_say
) -> Toolchain:
    """Build whatever is missing (or named in `rebuild`) and return the toolchain.

    Downloads run one tool ahead of compiles (a thread doing `go get` while `go build` uses the
    cores), so only the first tool's download is spent waiting.
    """
    specs = load_specs()
    unknown = [name for name in [*(names or []), *rebuild] if name not in specs]
    if unknown:
        raise ToolchainError(f"unknown toolchain entries {unknown}; known: {sorted(specs)}")
    entries = {}
    pending = []
    started = time.monotonic()
    for name in names or default_tools(specs):
        spec = specs[name]
        entry = cache_root() / "toolchain" / spec.key
        reason = "rebuild requested" if name in rebuild else check_entry(entry, spec)
        if reason is None:
            say(f"cache hit: {spec.key} ({entry})")
        else:
            say(f"to build: {spec.key} from Go modules ({reason})")
            pending.append((spec, entry))
        entries[name] = entry
    downloads = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="go-download")
    prepared = [downloads.submit(_prepare, spec, say) for spec, _ in pending]
    summary = []
    try:
        for (spec, entry), future in zip(pending, prepared):
            ready = future.result()
            try:
                summary.append(format_phases(spec.key, _compile(ready, entry, say)))
            finally:
                shutil.rmtree(ready.build.workdir, ignore_errors=True)
    finally:
        downloads.shutdown(cancel_futures=True)
        for future in prepared:
            if future.done() and not future.cancelled() and future.exception() is None:
                shutil.rmtree(future.result().build.workdir, ignore_errors=True)
    for line in summary:
        say(line)
    say(f"toolchain ready in {format_seconds(time.monotonic() - started)}")
    return Toolchain(entries)


def installed(names: list[str] | None = None) -> Toolchain:
    """The toolchain as built, without building: a clear error names what is missing."""
    specs = load_specs()
    entries = {}
    for name in names or default_tools(specs):
        entry = cache_root() / "toolchain" / specs[name].key
        if not (entry / MANIFEST).exists():
            fix = (f"start a platform of that profile (strata local up --profile {specs[name].profile}) or run "
                   f"`strata local toolchain {name}`" if specs[name].profile else "run `make setup`")
            raise ToolchainError(f"toolchain entry {specs[name].key} is not built; fix: {fix}")
        entries[name] = entry
    return Toolchain(entries)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="strata local toolchain", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="tools to build (default: those every platform uses)")
    parser.add_argument("--rebuild", action="append", default=[], help="rebuild this tool even if cached")
    args = parser.parse_args(argv)
    try:
        ensure(args.names or None, tuple(args.rebuild))
    except ToolchainError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
