"""`make up` / `strata dev up|down`: the bootstrap program's dev stack, offline, end to end.

Everything per user lives under one resolved, absolute home (`DevHome`): the passphrase file, the
file:// backend, the platform's state and the stack's own config file. The committed
`Pulumi.dev.yaml` is only read: the stack runs with `--config-file` pointing at a copy in the home,
where the CLI keeps this user's `encryptionsalt`, so `make up` leaves the working tree clean and one
user's salt never reaches another. The backend and passphrase are passed to the CLI explicitly, so
neither depends on how the CLI expands `~`. `up` waits until every Stack the dev stack creates is
Ready; `down` shows each Stack being destroyed and stops, naming it, when one cannot be.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from strata_operator.api.status import RECONCILING_RETRY
from strata_operator.decisions.lease import DEFAULT_LEASE_NAME

from ..team_entries import team_names, team_sync_path
from . import processes, stackwatch
from .operator_host import OPERATOR_NAMESPACE, PROCESS_NAME as OPERATOR_PROCESS
from .platform import LocalPlatform, PlatformConfig
from .preflight import find_pulumi_with_python_host, missing_dev_stack_requirements, missing_plugins
from .progress import Say, format_seconds, stderr_say, tail
from .toolchain import installed

STACK = "dev"
DEFAULT_UP_TIMEOUT = 1200.0
# How long `down` lets a Stack sit in its destroy without any change before it stops and says so.
DEFAULT_STUCK_SECONDS = 300.0
# ... and once its destroy failed and is being retried.
DESTROY_RETRY_PATIENCE = 60.0


class DevStackError(Exception):
    """The dev stack cannot run or did not converge; the message says what and the way out."""


@dataclasses.dataclass(frozen=True)
class DevHome:
    """Where one user's dev stack (or another stack of the bootstrap, `stack`) keeps everything; all paths
    absolute."""

    base: Path
    stack: str = STACK
    backend: str = ""
    """The stack's backend URL when not the home's file:// one (the cluster stack's object store)."""

    @property
    def passphrase_file(self) -> Path:
        return self.base / "passphrase"

    @property
    def backend_dir(self) -> Path:
        return self.base / "pulumi"

    @property
    def backend_url(self) -> str:
        return self.backend or f"file://{self.backend_dir}"

    @property
    def platform_dir(self) -> Path:
        return self.base / ("platform" if self.stack == STACK else f"platform-{self.stack}")

    @property
    def stack_config(self) -> Path:
        return self.base / f"Pulumi.{self.stack}.yaml"

    @property
    def make_suffix(self) -> str:
        """What `make up`/`make down` need to name this stack."""
        return "" if self.stack == STACK else f" STACK={self.stack}"


def dev_home(base: Path | str | None = None) -> DevHome:
    """The given directory, else $STRATA_HOME, else $XDG_STATE_HOME/strata, else ~/.local/state/strata
    ($HOME's, resolved here once: the CLI is never left to expand `~` itself)."""
    if base is None:
        base = os.environ.get("STRATA_HOME") or Path(
            os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "strata"
    return DevHome(Path(base).expanduser().absolute())


def project_name(project: Path) -> str:
    return str((yaml.safe_load((project / "Pulumi.yaml").read_text()) or {}).get("name", ""))


def passphrase(home: DevHome) -> str:
    """PULUMI_CONFIG_PASSPHRASE if set, else the home's passphrase file, generated once (mode 0600).

    The bootstrap hands it to the platform Stack (as a Secret), so it needs the value itself, not
    only a file; it travels by environment, never argv."""
    given = os.environ.get("PULUMI_CONFIG_PASSPHRASE")
    if given:
        return given
    path = home.passphrase_file
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32))
    return path.read_text().strip()


def passphrase_source(home: DevHome) -> str:
    return "$PULUMI_CONFIG_PASSPHRASE" if os.environ.get("PULUMI_CONFIG_PASSPHRASE") else str(home.passphrase_file)


def no_plugin_downloads() -> dict[str, str]:
    """No plugin downloads once the plugins the dev stack uses are installed. The project's virtualenv holds
    pulumi-gcp and pulumi-aws (the GKE and EKS modes, and the tests' mocks of them), whose plugins the
    Python host reports as the program's, so the engine would download both (hundreds of MB) for a stack
    that uses neither, and where that is refused, as here, try again at every run (2.5 s of each `make
    up`). With one of its own plugins missing, pulumi may still fetch it (online)."""
    return {} if missing_plugins() else {"PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true"}


def dev_environment(home: DevHome) -> dict[str, str]:
    """The environment of the dev stack's pulumi runs: this home's backend and passphrase, and the
    toolchain's kubectl and Flux binaries first on PATH (the user's pulumi, with its Python host, is
    run by path)."""
    home.backend_dir.mkdir(parents=True, exist_ok=True)
    env = {**no_plugin_downloads(), **os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true",
           "PULUMI_BACKEND_URL": home.backend_url, "PULUMI_CONFIG_PASSPHRASE": passphrase(home),
           "STRATA_STATE_DIR": str(home.platform_dir)}
    env["PATH"] = os.pathsep.join([*(str(d) for d in installed().bin_dirs), env.get("PATH", "")])
    return env


def stack_checkpoints(backend_dir: Path, project: str, stack: str) -> list[Path]:
    """The checkpoints of `project`/`stack` (`project` may be a glob) in a file:// backend directory."""
    return sorted(path for path in (backend_dir / ".pulumi" / "stacks").glob(f"{project}/{stack}.json*")
                  if path.name.endswith((".json", ".json.gz")))


def checkpoint_path(home: DevHome, project: str) -> Path | None:
    """The dev stack's checkpoint in the file:// backend, or None when the stack does not exist."""
    return next(iter(stack_checkpoints(home.backend_dir, project, home.stack)), None)


def _read_checkpoint(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def checkpoint_salt(path: Path) -> str | None:
    """The passphrase salt an existing stack's state was encrypted with (DIY backends keep it there)."""
    latest = _read_checkpoint(path).get("checkpoint", {}).get("latest") or {}
    return ((latest.get("secrets_providers") or {}).get("state") or {}).get("salt")


def build_stack_config(committed: dict[str, Any], home: DevHome, salt: str | None) -> dict[str, Any]:
    """The stack config the CLI runs with: the committed one, with this home's platform directory and
    backend in place of the committed defaults, and this user's salt."""
    config = json.loads(json.dumps(committed.get("config") or {}))  # a deep copy of plain YAML data
    cluster = config.get("strata:cluster") or {}
    if cluster.get("mode", "local") == "local":
        cluster.setdefault("local", {})["stateDir"] = str(home.platform_dir)
        config["strata:cluster"] = cluster
    platform = config.get("strata:platform")
    if isinstance(platform, dict) and str(platform.get("backend", "file://")).startswith("file://"):
        # The platform stack references this one: the same backend, whatever HOME says.
        platform["backend"] = home.backend_url
    settings: dict[str, Any] = {"secretsprovider": "passphrase"}
    if salt:
        settings["encryptionsalt"] = salt
    settings["config"] = config
    return settings


def write_stack_config(project: Path, home: DevHome, salt: str | None,
                       fill: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Path:
    """The home's copy of the committed stack config, with `fill` applied to its `config` (this machine's
    values, for a stack other than dev)."""
    committed = yaml.safe_load((project / f"Pulumi.{home.stack}.yaml").read_text()) or {}
    settings = build_stack_config(committed, home, salt)
    if fill is not None:
        settings["config"] = fill(settings["config"])
    text = (f"# Generated by `strata dev up` from {project / f'Pulumi.{home.stack}.yaml'} on every run: "
            "edit that file.\n" + yaml.safe_dump(settings, sort_keys=False))
    home.stack_config.parent.mkdir(parents=True, exist_ok=True)
    home.stack_config.write_text(text)
    return home.stack_config


def known_salt(home: DevHome, project: str) -> str | None:
    """This user's salt: from the home's stack config, else from the backend's state of the stack."""
    if home.stack_config.is_file():
        salt = (yaml.safe_load(home.stack_config.read_text()) or {}).get("encryptionsalt")
        if salt:
            return salt
    checkpoint = checkpoint_path(home, project)
    return checkpoint_salt(checkpoint) if checkpoint else None


def expected_objects(stack_config: dict[str, Any], project: Path) -> list[str]:
    """Keys (as stackwatch names them) of what the dev stack's layers create and must see Ready: the
    platform Stack, each team's hand-off Stack, the app Stack of each team with a program of the
    platform's (`dir` or `repo`), Flux's Kustomization, each team's own (its directory of this project),
    and every Stack in the directories they sync."""
    config = stack_config.get("config") or {}
    keys = []
    flux = config.get("strata:flux") or {}
    sync = flux.get("sync")
    if config.get("strata:platform"):
        namespace = (config.get("strata:operator") or {}).get("namespace", OPERATOR_NAMESPACE)
        keys.append(f"{namespace}/strata-platform")
        for team in config.get("strata:teams") or []:
            team_namespace = team_names(team["name"], team.get("namespace"))["namespace"]
            keys.append(f"{namespace}/team-{team['name']}-handoff")
            if "dir" in team or "repo" in team:
                keys.append(f"{team_namespace}/team-{team['name']}")
            if team_sync_path(team, (sync or {}).get("path")):
                keys.append(f"kustomization {team_namespace}/team-{team['name']}")
    if sync is not None:
        namespace = flux.get("namespace", "flux-system")
        keys.append(f"kustomization {namespace}/{namespace}")
        if "url" not in sync:  # this project's own directory: its Stacks are known here
            # A team directory is applied by that team's own sync: nobody applies one of a team not configured.
            configured = {f"team-{team['name']}" for team in config.get("strata:teams") or []}
            root = project / sync.get("path", ".")
            keys += synced_stacks(root, skip={path.name for path in root.glob("team-*") if path.name not in configured})
    return keys


def synced_stacks(directory: Path, skip: set[str] = frozenset()) -> list[str]:
    """namespace/name of the Stack manifests in a directory Flux syncs, but for its subdirectories `skip`."""
    keys = []
    for path in sorted(directory.rglob("*.yaml")):
        if skip & set(path.relative_to(directory).parts[:-1]):
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == "Stack":
                meta = document.get("metadata") or {}
                keys.append(f"{meta.get('namespace', 'default')}/{meta.get('name', '')}")
    return keys


class PulumiRun:
    """The user's pulumi CLI run in the project with the dev environment; output shown as it comes and
    its tail kept, so a failure can be explained."""

    def __init__(self, project: Path, home: DevHome, env: dict[str, str], cli: Path | None = None):
        cli = cli or find_pulumi_with_python_host()
        if cli is None:
            raise DevStackError("; ".join(missing_dev_stack_requirements()))
        # The CLI's own directory first: its bundled plugins (the dynamic-provider shim) beside it win.
        env = {**env, "PATH": os.pathsep.join([str(cli.parent), env.get("PATH", "")])}
        self.cli, self.project, self.home, self.env = cli, project, home, env
        self.process: subprocess.Popen[str] | None = None

    def __call__(self, *args: str, cwd: Path | None = None, show: bool = True) -> None:
        tail: deque[str] = deque(maxlen=60)
        self.process = subprocess.Popen([str(self.cli), *args], cwd=cwd or self.project, env=self.env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        assert self.process.stdout is not None
        try:
            for line in self.process.stdout:
                tail.append(line)
                if show:
                    print(line, end="", flush=True)
        except KeyboardInterrupt:
            # The CLI runs in its own session (so `interrupt` reaches its whole tree): pass Ctrl-C on and
            # let it cancel cleanly, releasing the stack's lock, before giving up.
            self.interrupt()
            self.process.wait()
            raise
        code = self.process.wait()
        if code != 0:
            raise DevStackError(self.explain(args, code, "".join(tail)))

    def interrupt(self) -> None:
        """Cancel a running CLI the way Ctrl-C does (it stops cleanly, releasing the stack's lock)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)

    def explain(self, args: tuple[str, ...], code: int, output: str) -> str:
        command = f"pulumi {' '.join(args[:2])}"
        if "incorrect passphrase" in output or "failed to decrypt" in output:
            return (f"`{command}` failed: the passphrase from {passphrase_source(self.home)} does not match the "
                    f"existing {self.home.stack} stack in {self.home.backend_url} (it was made with another "
                    "passphrase). "
                    f"Way out: run `make down` with the old passphrase (PULUMI_CONFIG_PASSPHRASE=<old> make down), "
                    f"or remove the stale stack with `PULUMI_BACKEND_URL={self.home.backend_url} pulumi stack rm "
                    f"{self.home.stack} --force --yes --preserve-config` (its local processes: `strata local "
                    "--state-dir "
                    f"{self.home.platform_dir} down`)")
        return f"`{command}` failed (exit {code}); its output is above"


def prepare(project: Path, home: DevHome, cli: Path | None = None, env: Mapping[str, str] | None = None,
            exists: bool | None = None, fill: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
            ) -> tuple[PulumiRun, dict[str, Any]]:
    """The CLI runner and the stack config, with the stack created in the backend if it is new. `env` adds
    to the runs' environment, `exists` says whether the stack exists where its backend is no file:// one,
    `fill` puts this machine's values into the config (see write_stack_config)."""
    run = PulumiRun(project, home, {**dev_environment(home), **(env or {})}, cli)
    name = project_name(project)
    salt = known_salt(home, name)
    if not _stack_exists(home, name, exists):
        # `stack init` writes the new salt beside the project file it finds: let it write into a scratch
        # copy of Pulumi.yaml, never into the working tree.
        with tempfile.TemporaryDirectory(prefix="strata-dev-init-") as scratch:
            shutil.copy(project / "Pulumi.yaml", Path(scratch) / "Pulumi.yaml")
            run("stack", "init", home.stack, "--secrets-provider", "passphrase", "--non-interactive",
                cwd=Path(scratch), show=False)
            salt = (yaml.safe_load((Path(scratch) / f"Pulumi.{home.stack}.yaml").read_text()) or {}).get(
                "encryptionsalt")
    write_stack_config(project, home, salt, fill)
    return run, yaml.safe_load(home.stack_config.read_text())


def _stack_exists(home: DevHome, project: str, exists: bool | None) -> bool:
    """`exists` when the caller knows (a backend other than the home's file:// one), else the checkpoint's."""
    return checkpoint_path(home, project) is not None if exists is None else exists


def _describe(home: DevHome, say: Say) -> None:
    say(f"  home:       {home.base}")
    say(f"  backend:    {home.backend_url}")
    say(f"  passphrase: {passphrase_source(home)}")
    say(f"  platform:   {home.platform_dir}")
    say(f"  config:     {home.stack_config} (from Pulumi.{home.stack}.yaml)")


def up(project: Path, home: DevHome | None = None, timeout: float = DEFAULT_UP_TIMEOUT,
       say: Say = stderr_say) -> None:
    missing = missing_dev_stack_requirements()
    if missing:
        raise DevStackError("the dev stack needs: " + "; ".join(missing))
    home = home or dev_home()
    started = time.monotonic()
    say(f"==> the {home.stack} stack of {project}")
    _describe(home, say)
    run, stack_config = prepare(project, home)
    up_and_wait(run, project, home, stack_config, home.platform_dir / "kubeconfig", timeout, started, say,
                blocker=lambda reader: operator_blocker(home.platform_dir, reader))


def up_and_wait(run: PulumiRun, project: Path, home: DevHome, stack_config: dict[str, Any], kubeconfig: Path,
                timeout: float, started: float, say: Say,
                blocker: Callable[[stackwatch.StackReader], Callable[[], str]] | None = None) -> None:
    """`pulumi up` of the home's stack, then wait, a line per change, until every Stack and Kustomization
    its layers create is Ready (or one stalls, or `timeout`), and end with the summary."""
    say(f"==> pulumi up of the {home.stack} stack")
    run("up", "--stack", home.stack, "--config-file", str(home.stack_config), "--yes", "--skip-preview",
        "--non-interactive")
    expected = expected_objects(stack_config, project)
    reader = stackwatch.StackReader(kubeconfig)
    try:
        if expected:
            say(f"==> waiting until every Stack and Kustomization is Ready (timeout {format_seconds(timeout)}): "
                f"{', '.join(expected)}")
            verdict, states = stackwatch.watch(reader.list_with_flux, stackwatch.ready_verdict, expected=expected,
                                               timeout=timeout, say=say,
                                               blocker=blocker(reader) if blocker else lambda: "")
            _raise_unless_ready(verdict, states, timeout, kubeconfig, home)
        flux = stackwatch.flux_lines(reader.flux_sources_and_kustomizations())
    finally:
        reader.close()
    stacks = len([key for key in expected if " " not in key])
    say(f"==> the {home.stack} stack is up in {format_seconds(time.monotonic() - started)}: {stacks} Stack(s) Ready")
    if flux:
        say("  Flux sources and Kustomizations (as `flux get all -A`):")
        for line in flux:
            say(line)
    _describe(home, say)
    say(f"  export KUBECONFIG={kubeconfig}")
    say(f"  export PATH={installed().bin('kubectl').parent}:$PATH   # the toolchain's kubectl")
    say("  kubectl get stacks -A        # every layer's Stack")
    command = f"make down{home.make_suffix}"
    say(f"  {command:<28} # destroy it all, local processes included")


def operator_blocker(platform_dir: Path, reader: stackwatch.StackReader) -> Callable[[], str]:
    """Why the platform's operator handles no Stacks now, from its process and its leader Lease ("" when
    it leads, or when no operator was started on this platform)."""
    platform = LocalPlatform(PlatformConfig(state_dir=platform_dir))
    log = platform.log_dir / f"{OPERATOR_PROCESS}.log"

    def blocker() -> str:
        if not (platform.run_dir / f"{OPERATOR_PROCESS}.json").exists():  # never started, or stopped on purpose
            return ""
        pid = processes.running_pid(platform.run_dir, OPERATOR_PROCESS)
        lease = reader.lease(OPERATOR_NAMESPACE, DEFAULT_LEASE_NAME) if pid is not None else None
        renewed = None
        if lease and lease.get("renewTime"):
            renewed = (datetime.now(timezone.utc) - datetime.fromisoformat(str(lease["renewTime"]))).total_seconds()
        lines = tail(log, 3).strip().splitlines() if pid is None else []
        return stackwatch.operator_blocker(stackwatch.OperatorView(
            pid=pid, last_line=lines[-1] if lines else "", log=str(log),
            lease=f"{OPERATOR_NAMESPACE}/{DEFAULT_LEASE_NAME}", holder=(lease or {}).get("holderIdentity") or "",
            renewed_seconds_ago=renewed, duration_seconds=float((lease or {}).get("leaseDurationSeconds") or 15)),
            socket.gethostname())

    return blocker


def _raise_unless_ready(verdict: stackwatch.Verdict, states: Mapping[str, stackwatch.StackState], timeout: float,
                        kubeconfig: Path, home: DevHome) -> None:
    if verdict.failed:
        failed = verdict.failed[0]
        kind, _, where = failed.key.rpartition(" ")
        raise DevStackError(f"{kind or 'Stack'} {where} is Stalled ({failed.reason}): {failed.message}\n"
                            f"Fix the cause, then `make up{home.make_suffix}` again; see it with "
                            f"`kubectl describe {kind or 'stack'} -n "
                            f"{where.replace('/', ' ')}` (KUBECONFIG={kubeconfig}).")
    if not verdict.done:
        waiting = [state.line().strip() for state in states.values() if state.state != "Ready"]
        raise DevStackError(f"not everything was Ready after {format_seconds(timeout)}:\n  "
                            + "\n  ".join(waiting)
                            + f"\nRaise the limit with `make up{home.make_suffix} TIMEOUT=<seconds>`.")


def down(project: Path, home: DevHome | None = None, force: bool = False,
         stuck_after: float = DEFAULT_STUCK_SECONDS, say: Say = stderr_say, env: Mapping[str, str] | None = None,
         exists: bool | None = None, fill: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
         platform: LocalPlatform | None = None) -> None:
    """Destroy the dev stack (or the home's other stack: `env`, `exists` and `fill` as for prepare, its
    `platform`), showing each Stack being destroyed. A Stack whose destroy fails or makes
    no progress for `stuck_after` seconds stops it, named with its reason; with `force` its finalizer
    is removed instead (saying what it may leave behind). Either way no local process is left."""
    home = home or dev_home()
    name = project_name(project)
    platform = platform or LocalPlatform(PlatformConfig(state_dir=home.platform_dir))
    if not _stack_exists(home, name, exists):
        say(f"==> no {home.stack} stack in {home.backend_url}: nothing to destroy")
        _stop_platform(platform, home, remove_state=force, say=say)
        return
    say(f"==> pulumi destroy of the {home.stack} stack")
    _describe(home, say)
    run, _config = prepare(project, home, env=env, exists=True, fill=fill)
    local = local_process_urns(checkpoint_path(home, name))
    if local and not all(platform.status().values()):
        # The operator destroys the Stacks' resources before the Stack objects go: it must be running.
        say("==> the local platform is not running: starting its processes again so its operator can destroy")
        run("up", "--stack", home.stack, "--config-file", str(home.stack_config), "--yes", "--skip-preview",
            "--non-interactive", *(arg for urn in local for arg in ("--target", urn)))
    blocked: list[stackwatch.StackState] = []
    done = False
    try:
        blocked = _destroy_watching_stacks(run, home, force, stuck_after, say)
        done = not blocked
    except DevStackError:
        if not force:
            raise
        say(f"  forced: the destroy failed; removing the {home.stack} stack's state ({home.backend_url})")
        # --preserve-config: `stack rm` would otherwise delete the tracked Pulumi.dev.yaml.
        run("stack", "rm", home.stack, "--force", "--yes", "--preserve-config", "--non-interactive", show=False)
        done = True
    finally:
        # Whatever happened, no process is left; the platform's state goes once nothing needs it again.
        _stop_platform(platform, home, remove_state=done, say=say)
    if blocked:
        first = blocked[0]
        raise DevStackError(
            f"Stack {first.key} could not be destroyed ({first.reason or first.state}): {first.message}\n"
            f"Choices: fix the cause and run `make down{home.make_suffix}` again, or `make down{home.make_suffix} "
            "FORCE=1`, which removes its "
            "finalizer (its resources stay where they are) and still stops every local process.")


def watch_deletions(reader: stackwatch.StackReader, *, force: bool, stuck_after: float, say: Say,
                    stop: Callable[[], bool]) -> list[stackwatch.StackState]:
    """Follow the Stacks being deleted (a line per change) until `stop()`; returns the ones whose destroy
    failed or stood still longer than its patience. With `force` their finalizers are removed instead,
    saying what each may leave behind, and the watch goes on."""
    last_change: dict[str, tuple[stackwatch.StackState, float]] = {}

    def deleting() -> list[dict[str, Any]]:
        return [s for s in reader.list() if s.get("metadata", {}).get("deletionTimestamp")]

    def stuck(states: Mapping[str, stackwatch.StackState]) -> stackwatch.Verdict:
        now = time.monotonic()
        for key, state in states.items():
            if last_change.get(key, (None,))[0] != state:
                last_change[key] = (state, now)
        return stackwatch.Verdict(False, [state for state in states.values() if state.state == "Stalled"
                                          or now - last_change[state.key][1] >= _patience(state, stuck_after)])

    while not stop():
        verdict, _states = stackwatch.watch(deleting, stuck, timeout=float("inf"), say=say, stop=stop)
        if not verdict.failed:
            return []
        if not force:
            return verdict.failed
        for state in verdict.failed:
            say(f"  forced: removing the finalizer of Stack {state.key} ({state.reason or state.state}); "
                f"{left_behind(reader.get(state.key))}, and stays where it is")
            reader.remove_finalizers(state.key)
            last_change.pop(state.key, None)
    return []


def _destroy_watching_stacks(run: PulumiRun, home: DevHome, force: bool, stuck_after: float,
                             say: Say) -> list[stackwatch.StackState]:
    """`pulumi destroy` while the Stacks it deletes are watched; returns the ones that blocked it (it
    is interrupted then), or [] when it finished."""
    kubeconfig = home.platform_dir / "kubeconfig"
    finished = threading.Event()
    blocked: list[stackwatch.StackState] = []
    reader = stackwatch.StackReader(kubeconfig) if kubeconfig.is_file() else None

    def observe() -> None:
        blocked.extend(watch_deletions(reader, force=force, stuck_after=stuck_after, say=say, stop=finished.is_set))
        if blocked:
            run.interrupt()

    watcher = threading.Thread(target=observe, daemon=True) if reader is not None else None
    if watcher is not None:
        watcher.start()
    try:
        run("destroy", "--stack", home.stack, "--config-file", str(home.stack_config), "--yes", "--skip-preview",
            "--non-interactive")
    except DevStackError:
        if not blocked:
            raise
    finally:
        finished.set()
        if watcher is not None:
            watcher.join(timeout=10)
        if reader is not None:
            reader.close()
    return blocked


def local_process_urns(checkpoint: Path | None) -> list[str]:
    """The dev stack's resources that are local processes (the platform, the operator) or their
    files: its dynamic resources, which start what is not running when they are updated."""
    if checkpoint is None:
        return []
    latest = _read_checkpoint(checkpoint).get("checkpoint", {}).get("latest") or {}
    return [resource["urn"] for resource in latest.get("resources") or []
            if resource.get("type") == "pulumi-python:dynamic:Resource"]


def _patience(state: stackwatch.StackState, stuck_after: float) -> float:
    """How long a Stack being deleted may stand still: less once its destroy has failed (the operator
    retries it, but a program that cannot load fails the same way every time)."""
    return min(DESTROY_RETRY_PATIENCE, stuck_after) if state.reason == RECONCILING_RETRY else stuck_after


def left_behind(stack: dict[str, Any]) -> str:
    """What a Stack whose finalizer is removed may leave: the resources its state still holds, read
    from its file:// backend (where the dev stack's layers keep theirs), else a plain warning."""
    spec = stack.get("spec") or {}
    backend, name = str(spec.get("backend", "")), str(spec.get("stack", ""))
    parts = name.split("/")
    if backend.startswith("file://"):
        # organization/project/stack, or a bare stack name whose project only its Pulumi.yaml knows.
        found = stack_checkpoints(Path(backend.removeprefix("file://")).expanduser(),
                                  parts[1] if len(parts) == 3 else "*", parts[-1])
        checkpoint = found[0] if len(found) == 1 else None
        if checkpoint is not None:
            latest = _read_checkpoint(checkpoint).get("checkpoint", {}).get("latest") or {}
            kinds: dict[str, int] = {}
            for resource in latest.get("resources") or []:
                kind = resource.get("type", "")
                if kind != "pulumi:pulumi:Stack" and not kind.startswith("pulumi:providers:"):
                    kinds[kind] = kinds.get(kind, 0) + 1
            if not kinds:
                return f"its stack {name} holds no resources"
            return f"its stack {name} still holds " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    return f"whatever its stack {name or '(unknown)'} created in {backend or 'its backend'} stays there"


def _stop_platform(platform: LocalPlatform, home: DevHome, remove_state: bool, say: Say) -> None:
    """No process of the platform, the operator or its workers is left; with `remove_state` the
    platform's directory goes too."""
    stopped = platform.down(say=say)
    if stopped:
        say(f"  stopped {len(stopped)} local process(es)")
    if remove_state and home.platform_dir.exists():
        shutil.rmtree(home.platform_dir)
        say(f"  removed the platform state {home.platform_dir}")
