"""Shared by the operator benchmarks: a scratch local platform with the real operator, and Stack helpers."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import tempfile
import threading
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from strata_components import s3
from strata_components.local import objectstore, realnode
from strata_components.local.images import build_operator_image, load_image, user_pulumi_install
from strata_components.local.kube import api_client
from strata_components.local.processes import descendants
from strata_components.local.operator_host import OperatorHost, operator_host, serve_namespace
from strata_components.local.platform import LocalPlatform, PlatformConfig
from strata_components.local.toolchain import Toolchain, installed, profile_tools
from strata_operator.api import FILE_BACKEND_ANNOTATION

GROUP, VERSION = "pulumi.com", "v1"
PASSPHRASE = "benchmark-passphrase"
NAMESPACE = "bench"
WORKSPACE_USER = 65532  # the operator image's user, which writes the workspace's state volume


def stash_program(count: int = 1, revision: str = "") -> dict[str, Any]:
    """A Pulumi YAML program body with `count` builtin Stash resources (no provider plugin needed); a new
    `revision` changes every resource's input, so an update steps through all of them, not just one."""
    suffix = f" {revision}" if revision else ""
    return {"resources": {f"note{i}": {"type": "pulumi:index:Stash", "properties": {"input": f"value {i}{suffix}"}}
                          for i in range(count)},
            "outputs": {"first": "${note0.input}"}}


# The pod executor's Stacks keep file:// state on a volume of their workspace pod (one claim per namespace).
STATE_MOUNT = "/state"
WORKSPACE_TEMPLATE = {"spec": {
    # Small requests so that a fleet fits this 2-core node (the default, 100m, schedules 10 pods per core).
    "resources": {"requests": {"cpu": "10m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
    "podTemplate": {"spec": {
        "containers": [{"name": "pulumi", "volumeMounts": [{"name": "state", "mountPath": STATE_MOUNT}]}],
        "volumes": [{"name": "state", "persistentVolumeClaim": {"claimName": "state"}}]}}}}


@dataclasses.dataclass
class Bench:
    platform: LocalPlatform
    operator: OperatorHost
    api: client.ApiClient
    scratch: Path
    namespace: str = NAMESPACE
    workspace_template: dict[str, Any] | None = None  # the pod executor's (None: the process executor)
    workspace_reclaim_policy: str = ""  # the pod executor's Stacks' spec.workspaceReclaimPolicy ("": Retain)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def backend(self, name: str) -> str:
        if self.workspace_template is not None:
            return f"file://{STATE_MOUNT}/{name}"
        path = self.scratch / "backends" / name
        path.mkdir(parents=True, exist_ok=True)
        return path.as_uri()

    def backend_dir(self, name: str) -> Path:
        """Where `backend(name)` is on this host (the pod executor's: in the node's state volume)."""
        if self.workspace_template is not None:
            return node_state_dir(self.scratch, self.namespace) / name
        return self.scratch / "backends" / name

    def create_program(self, name: str, program: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "programs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Program", "metadata": {"name": name}, "program": program})

    def create_stack(self, name: str, program: str, backend: str, labels: dict[str, str] | None = None) -> None:
        spec = {"stack": name, "backend": backend, "programRef": {"name": program},
                "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": "pulumi",
                                                                                       "key": "passphrase"}}}}
        if self.workspace_template is not None:
            spec["workspaceTemplate"] = self.workspace_template
            if self.workspace_reclaim_policy:
                spec["workspaceReclaimPolicy"] = self.workspace_reclaim_policy
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "stacks", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": name, "labels": labels or {}},
            "spec": spec})

    def stacks(self) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "stacks")["items"]

    def get_stack(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "stacks", name)


def is_ready(stack: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (stack.get("status") or {}).get("conditions") or [])


def _stat_cpu(stat: str) -> tuple[str, float]:
    """(name, own CPU seconds: utime+stime) from the text of /proc/<pid>/stat."""
    fields = stat[stat.rindex(")") + 2:].split()
    return stat[stat.index("(") + 1:stat.rindex(")")], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    return _stat_cpu(Path(f"/proc/{pid}/stat").read_text())[1]


def cpu_model() -> str:
    """The host's CPU model, and whether it has the SHA extensions: without them each of the pulumi CLI's
    passphrase key derivations (PBKDF2-SHA256, 1,000,000 rounds) costs about 0.9 CPU-s here, a Stack's
    first update two of them, so fleet figures from machines of different CPUs do not compare."""
    info = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    return f"{model}, {'with' if ' sha_ni' in info else 'without'} SHA extensions"


def process_cpu() -> dict[int, tuple[str, float]]:
    """Every process on the host: pid -> (its name, comm, and its own CPU seconds so far, utime+stime)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = _stat_cpu((entry / "stat").read_text())
            except OSError:
                continue
    return found


class CpuByProcess(threading.Thread):
    """The host's CPU seconds during a phase by process name, from /proc every `interval` seconds (a read
    costs about 5 ms of CPU per 70 processes, 25 ms with 50 workspace pods' processes; it shows in the
    figures as the benchmark's own). A process that starts and ends between two reads is missed: the
    figures say where the CPU went, not all of it (the machine's total is `cpu_times`); `names` renames
    pids (the operator's own process is `python` like its workers)."""

    def __init__(self, names: dict[int, str], interval: float = 1.0):
        super().__init__(daemon=True)
        self.names, self.interval, self.stopping = names, interval, threading.Event()
        self.baseline = {pid: cpu for pid, (_, cpu) in process_cpu().items()}
        self.latest: dict[int, tuple[str, float]] = {}

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.latest.update(process_cpu())

    def seconds(self) -> dict[str, float]:
        """Stop, then the CPU seconds per process name since this was made, largest first."""
        self.stopping.set()
        self.join()
        self.latest.update(process_cpu())
        totals: Counter = Counter()
        for pid, (name, cpu) in self.latest.items():
            totals[self.names.get(pid, name)] += cpu - self.baseline.get(pid, 0.0)
        return {name: round(cpu, 1) for name, cpu in totals.most_common() if cpu >= 0.05}


def node_pods_cpu_seconds(platform: LocalPlatform) -> float:
    """CPU seconds of all pods on the platform's real node so far, from the kubelet's cgroup root (exact:
    it holds short-lived processes too). cgroups v1 (cpuacct, nanoseconds) or v2 (cpu.stat, microseconds)."""
    root = realnode.load_node(realnode.node_dirs(platform.state)[0]).cgroup_root.lstrip("/")
    v1 = Path("/sys/fs/cgroup/cpuacct", root, "cpuacct.usage")
    if v1.is_file():
        return int(v1.read_text()) / 1e9
    stat = dict(line.split() for line in Path("/sys/fs/cgroup", root, "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


class StackWatch(threading.Thread):
    """Every write to a Stack in the namespace, from a resourceVersion watch: when each Stack was first
    seen Ready, and the time of every MODIFIED event, split into status writes (the status changed) and
    other writes (metadata: finalizers, Kopf's annotations). It outlives an apiserver or etcd outage, going on
    from the last resourceVersion seen."""

    def __init__(self, bench, started: float) -> None:
        super().__init__(daemon=True)
        self.bench, self.started = bench, started
        self.ready_at: dict[str, float] = {}
        self.status_writes: list[float] = []  # seconds since `started`
        self.other_writes: list[float] = []
        self.last_status: dict[str, object] = {}
        self.stopping = threading.Event()

    def see(self, kind: str, stack: dict) -> None:
        now = time.monotonic()
        name = stack["metadata"]["name"]
        status = stack.get("status")
        if kind == "MODIFIED":
            changed = status != self.last_status.get(name)
            (self.status_writes if changed else self.other_writes).append(round(now - self.started, 2))
        self.last_status[name] = status
        if name not in self.ready_at and is_ready(stack):
            self.ready_at[name] = now

    def run(self) -> None:
        custom, namespace = self.bench.custom, self.bench.namespace
        version = None
        while not self.stopping.is_set():
            try:
                if version is None:  # (re)list: the baseline for every Stack, no writes counted
                    listing = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "stacks")
                    for stack in listing["items"]:
                        self.see("LISTED", stack)
                    version = listing["metadata"]["resourceVersion"]
                for event in watch.Watch().stream(custom.list_namespaced_custom_object, GROUP, VERSION, namespace,
                                                  "stacks", resource_version=version, timeout_seconds=60,
                                                  allow_watch_bookmarks=True):
                    stack = event["object"]
                    if event["type"] == "ERROR":  # the server ended the watch (etcd gone, say): list again
                        version = None
                        break
                    if event["type"] not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
                        raise RuntimeError(f"Stack watch: {event['type']} {stack}")
                    version = stack["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.see(event["type"], stack)
                    if self.stopping.is_set():
                        return
            except ApiException as error:
                if error.status == 410:
                    version = None  # expired: relist
                elif error.status >= 500:
                    time.sleep(1)  # the apiserver without etcd: go on from the last version seen
                else:
                    raise
            except urllib3.exceptions.HTTPError:
                time.sleep(1)  # the apiserver stopped (the chaos benchmark does that): go on once it is back
            except Exception:
                if self.stopping.is_set():
                    return  # the platform went down after the figures were taken
                raise

    def per_minute(self, writes: list[float], start: float, end: float) -> list[int]:
        minutes = Counter(int((at - start) // 60) for at in writes if start <= at < end)
        return [minutes.get(index, 0) for index in range(max(1, int((end - start) // 60)))]


def runs_since_change(updates: dict[str, list[dict]], at_change: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The runs of `updates` (the history read after a change) that are not in `at_change` (the history read
    at the change): startTime is in whole seconds, so a run that ended in the second of the change would
    otherwise count as one after it."""
    before = {(name, update["startTime"], update.get("message", "")) for name, runs in at_change.items()
              for update in runs}
    after = {name: [update for update in runs if (name, update["startTime"], update.get("message", "")) not in before]
             for name, runs in updates.items()}
    return {name: runs for name, runs in after.items() if runs}


def start_times(updates: dict[str, list[dict]]) -> dict[str, list[int]]:
    """Each stack's runs' start times (Unix seconds)."""
    return {name: [update["startTime"] for update in runs] for name, runs in updates.items()}


def engine_run_starts(backend: Path, since: float = 0) -> dict[str, list[int]]:
    """When each engine run began, per stack, from a file:// backend's own update history (one file per
    finished `pulumi up`, whatever the operator logged or recorded): those started at or after `since`
    (Unix time; the history's startTime is in whole seconds)."""
    return start_times(stack_updates(backend, since))


def stack_updates(backend: Path, since: float = 0) -> dict[str, list[dict]]:
    """Each stack's `pulumi up` runs in a file:// backend's update history (see history_updates)."""
    return history_updates(((entry.parent.name, json.loads(entry.read_text()))
                            for entry in (backend / ".pulumi" / "history").glob("*/*/*.history.json")), since)


def history_updates(entries: Iterable[tuple[str, dict]], since: float = 0) -> dict[str, list[dict]]:
    """(stack, history entry) pairs of any backend -> each stack's `pulumi up` runs started at or after
    `since`, in order of start."""
    updates: dict[str, list[dict]] = {}
    for stack, update in entries:
        if update.get("kind") == "update" and update.get("startTime", 0) >= since:
            updates.setdefault(stack, []).append(update)
    return {name: sorted(runs, key=lambda u: u["startTime"]) for name, runs in updates.items()}


class S3Bucket:
    """Read-only access to one bucket of an S3-compatible store (the cluster profile's MinIO), signed by
    the repository's own SigV4 signer: the s3:// backend's history and locks, counted as on a file:// one."""

    def __init__(self, endpoint: str, bucket: str, credentials: s3.Credentials) -> None:
        self.endpoint, self.bucket, self.credentials = endpoint.rstrip("/"), bucket, credentials

    def _get(self, path: str, query: dict[str, str] | None = None) -> str:
        status, body = s3.request(self.endpoint, "GET", path, self.credentials, query=query)
        if status != 200:  # the store's error code only: never a credential
            raise s3.S3Error(f"GET {path} in {self.endpoint}: HTTP {status} ({s3.error_code(body)})")
        return body

    def keys(self, prefix: str) -> list[str]:
        """Every key under `prefix` (ListObjectsV2, page by page)."""
        found: list[str] = []
        token = None
        while True:
            query = {"list-type": "2", "prefix": prefix, **({"continuation-token": token} if token else {})}
            root = ElementTree.fromstring(self._get(f"/{self.bucket}", query))
            space = root.tag.partition("}")[0] + "}" if root.tag.startswith("{") else ""
            found += [element.text or "" for element in root.iter(f"{space}Key")]
            token = root.findtext(f"{space}NextContinuationToken")
            if root.findtext(f"{space}IsTruncated") != "true" or not token:
                return found

    def read_json(self, key: str) -> dict:
        return json.loads(self._get(f"/{self.bucket}/{urllib.parse.quote(key, safe='/-_.~')}"))

    def updates(self, since: float = 0) -> dict[str, list[dict]]:
        """Each stack's engine runs from the backend's history (.pulumi/history/<project>/<stack>/)."""
        return history_updates(((key.split("/")[-2], self.read_json(key)) for key in self.keys(".pulumi/history/")
                                if key.endswith(".history.json")), since)

    def locks(self) -> list[str]:
        """Update locks left in the backend (.pulumi/locks/<org>/<project>/<stack>/<lock>.json)."""
        return [key for key in self.keys(".pulumi/locks/") if key.endswith(".json")]


def engine_runs(backend: Path, since: float = 0) -> Counter:
    """Engine runs per stack from the backend's update history (see engine_run_starts)."""
    return Counter({name: len(times) for name, times in engine_run_starts(backend, since).items()})


def locks_left(backends: list[Path]) -> int:
    """Update locks left in file:// backends (a finished or recovered update leaves none)."""
    return sum(len(list((backend / ".pulumi" / "locks").rglob("*.json"))) for backend in backends)


def write_json(path: Path | None, figures: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=1))


def _memory_kb(pid: int, path: str, field: str) -> int:
    try:
        text = Path(f"/proc/{pid}/{path}").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith(field)), 0)


def rss_tree_mb(pid: int) -> tuple[float, float]:
    """(RSS of pid, RSS of all its descendants) in MB."""
    return (_memory_kb(pid, "status", "VmRSS:") / 1024,
            sum(_memory_kb(child, "status", "VmRSS:") for child in descendants(pid)) / 1024)


def pss_tree_mb(pid: int) -> float:
    """PSS of pid's descendants in MB: pages shared between forked workers counted once, not per process."""
    return sum(_memory_kb(child, "smaps_rollup", "Pss:") for child in descendants(pid)) / 1024


def team_namespace(platform: LocalPlatform, api: client.ApiClient, namespace: str, file_backends: Path) -> None:
    """A namespace as the platform makes a team's: served by the operator (its Roles there), its file:// state
    in `file_backends` (the annotation the process executor's sandbox binds), a passphrase Secret."""
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace,
                                        "annotations": {FILE_BACKEND_ANNOTATION: str(file_backends)}}})
    serve_namespace(platform.kubeconfig_path, namespace)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "pulumi"}, "data": {
        "passphrase": base64.b64encode(PASSPHRASE.encode()).decode()}})


def object_store_secret(platform: LocalPlatform, core: client.CoreV1Api, namespace: str) -> tuple[dict, str]:
    """A Secret `object-store` in `namespace`: the platform's object-store keys and a new passphrase. Returns
    the Stack envRefs that pass them to its updates, and the passphrase (for whatever must redact it)."""
    access_key, secret_key = objectstore.read_credentials(platform.object_store_credentials)
    passphrase = uuid.uuid4().hex
    core.create_namespaced_secret(namespace, {"metadata": {"name": "object-store"}, "stringData": {
        "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key, "PULUMI_CONFIG_PASSPHRASE": passphrase}})
    env_refs = {key: {"type": "Secret", "secret": {"name": "object-store", "key": key}}
                for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PULUMI_CONFIG_PASSPHRASE")}
    return env_refs, passphrase


def node_state_dir(scratch: Path, namespace: str) -> Path:
    """The node's directory behind the pod executor's state volume of `namespace`."""
    return scratch / "node-state" / namespace


def _state_volume(api: client.ApiClient, namespace: str, directory: Path) -> None:
    """The claim `state` bound to a directory of the node (a static PersistentVolume: no provisioner here)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, WORKSPACE_USER, WORKSPACE_USER)
    core = client.CoreV1Api(api)
    core.create_persistent_volume({"metadata": {"name": f"{namespace}-state"}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
        "hostPath": {"path": str(directory), "type": "Directory"}, "claimRef": {"namespace": namespace, "name": "state"}}})
    core.create_namespaced_persistent_volume_claim(namespace, {"metadata": {"name": "state"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": f"{namespace}-state",
        "resources": {"requests": {"storage": "1Gi"}}}})
    # Bound before any Stack starts: a workspace pod whose claim is still unbound is unschedulable, which
    # the operator reports as the Stack's failure, retried after a 10 s backoff (the fleet's first runs did so).
    deadline = time.monotonic() + 60
    while core.read_namespaced_persistent_volume_claim("state", namespace).status.phase != "Bound":
        if time.monotonic() > deadline:
            raise TimeoutError(f"the claim {namespace}/state did not bind within 60 s")
        time.sleep(0.2)


def workspace_agents() -> list[int]:
    """Pids of the workspace agents running on this host (the real node's pods are host processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"strata_operator.engine.pod.agent" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def pod_executor_args(image: str, pull_policy: str, namespace: str) -> tuple[str, ...]:
    """A host operator's arguments for the pod executor: workspace pods of `image` on the real nodes, the
    operator scoped to `namespace` without leader election (others may run beside it on other namespaces)."""
    toleration = realnode.TOLERATION
    return ("--executor", "pod", "--workspace-image", image, "--workspace-image-pull-policy", pull_policy,
            *(a for k, v in realnode.NODE_LABEL.items() for a in ("--workspace-node-selector", f"{k}={v}")),
            "--workspace-toleration", f"{toleration['key']}={toleration['value']}:{toleration['effect']}",
            "--no-leader-election", "--namespace", namespace)


@contextlib.contextmanager
def platform_with_operator(operator_args: tuple[str, ...] = (),
                           host_controllers: tuple[str, ...] = (), executor: str = "process") -> Iterator[Bench]:
    """A scratch platform and the real operator; `host_controllers` names the Flux controllers to run
    as host processes (none by default: the operator benchmarks need no Flux). With `executor` "pod":
    one real node, the operator image loaded into it, and workspace pods there."""
    toolchain = installed()
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as tmp:
        scratch = Path(tmp)
        pods = executor == "pod"
        platform = LocalPlatform(PlatformConfig(state_dir=scratch / "platform", host_controllers=host_controllers,
                                                real_nodes=1 if pods else 0), toolchain=toolchain)
        try:
            platform.up(say=lambda _: None)
            executor_args: tuple[str, ...] = ()
            if pods:
                image = build_operator_image(toolchain, user_pulumi_install(), say=lambda _: None)
                load_image(image, realnode.load_node(realnode.node_dirs(platform.state)[0]).containerd_socket)
                executor_args = pod_executor_args(image.name, "Never", NAMESPACE)
            operator = operator_host(platform, toolchain, scratch / "operator", executor=executor,
                                     extra_args=(*executor_args, *operator_args))
            operator.start()
            with api_client(platform.kubeconfig_path) as api:
                team_namespace(platform, api, NAMESPACE, scratch / "backends")
                if pods:
                    _state_volume(api, NAMESPACE, node_state_dir(scratch, NAMESPACE))
                yield Bench(platform, operator, api, scratch, NAMESPACE, WORKSPACE_TEMPLATE if pods else None)
        finally:
            platform.down(say=lambda _: None)


@contextlib.contextmanager
def cluster_platform(hb: Heartbeat, prefix: str) -> Iterator[tuple[LocalPlatform, Toolchain, Path]]:
    """A scratch platform of the cluster profile (2 real nodes, the registry, the object store), its
    toolchain and a scratch directory; down at the end. Needs root: real nodes change the host."""
    if os.geteuid() != 0:
        raise SystemExit("run as root: real nodes change the host")
    toolchain = installed(profile_tools("cluster"))
    missing = realnode.missing_requirements(toolchain.bin("kubelet"))
    if missing:
        raise SystemExit("real nodes cannot start here: " + "; ".join(missing))
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        platform = LocalPlatform(PlatformConfig(state_dir=Path(scratch) / "cluster", profile="cluster"), toolchain)
        try:
            hb.phase("starting a scratch platform of the cluster profile (2 real nodes, registry, object store)")
            platform.up(say=hb.say)
            yield platform, toolchain, Path(scratch)
        finally:
            hb.phase("stopping the scratch platform")
            platform.down(say=hb.say)


@contextlib.contextmanager
def process_operator_beside(bench: Bench, namespace: str) -> Iterator[Bench]:
    """A second operator, with the process executor, on `namespace` of the same platform: for side-by-side
    figures in one run (both scoped to their namespaces, no leader election)."""
    toolchain = installed()
    operator = operator_host(bench.platform, toolchain, bench.scratch / f"operator-{namespace}",
                             extra_args=("--no-leader-election", "--namespace", namespace),
                             name=f"strata-operator-{namespace}")
    team_namespace(bench.platform, bench.api, namespace, bench.scratch / "backends")
    operator.start()
    try:
        yield Bench(bench.platform, operator, bench.api, bench.scratch, namespace, None)
    finally:
        operator.stop()


class Heartbeat(threading.Thread):
    """Progress at least every `every` seconds: `say` prints a line; when nothing was said for that long
    (a platform start, an image build, a wait), the thread says what is being waited for."""

    def __init__(self, every: float = 10) -> None:
        super().__init__(daemon=True)
        self.every, self.started = every, time.monotonic()
        self.last, self.doing = self.started, "starting"
        self.lock = threading.Lock()
        self.start()

    def say(self, line: str) -> None:
        with self.lock:
            print(f"[{time.monotonic() - self.started:6.0f} s] {line}", flush=True)
            self.last = time.monotonic()

    def phase(self, doing: str) -> None:
        self.doing = doing
        self.say(doing)

    def run(self) -> None:
        while True:
            time.sleep(1)
            if time.monotonic() - self.last >= self.every:
                self.say(f"  ... still {self.doing}")
