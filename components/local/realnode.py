"""Real nodes: kubelet on containerd beside the kwok ones, so that pods really run.

Opt-in (`strata local up --real-nodes N`): kwok stays the default because its nodes cost nothing.
A real node needs root and changes the host; `stop_nodes` undoes every change, recorded in
/run/strata/host.json (HOST_RECORD) before the first node starts. One platform at a time runs real nodes on a
host; the record names it, so that the next one undoes what a killed platform left (a stale bridge, chains
and network namespaces would break its pods' networking) before it records the host afresh:
- a bridge `strata0` holding the pods' gateway 10.88.0.1/16 (also the nodes' InternalIP) and
  10.96.0.1, the `kubernetes` Service's address: there is no kube-proxy, so the node gateway process
  forwards that address to the apiserver on loopback and in-cluster clients work unchanged;
- mounts under the node's directory (kubelet's root, pod volumes, container root filesystems);
- cgroups under /strata-<node> in every hierarchy;
- iptables and ip6tables chains kubelet or kube-proxy add (KUBE-FIREWALL, KUBE-SERVICES, ...), and the
  cluster profile's masquerade of the pods' egress (STRATA-POD-EGRESS, cluster_addons.py);
- the sysctls kubelet sets (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops) and
  net.ipv4.ip_forward (set for kube-proxy in the cluster profile, cluster_addons.py): restored;
- /var/lib/kubelet, /var/log/containers and /var/log/pods, where kubelet creates them;
- the pods' network namespaces (/run/netns/cni-*), which outlive pods whose containerd was killed.
Real nodes carry the taint `strata.dev/real-node=true:NoSchedule`: workloads written for kwok keep
landing on kwok, and a pod that must run says so with a toleration and the `type: real` node label.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import yaml

from . import processes
from .kube import write_private
from .pki import issue_client_certificate
from .processes import HostProcess

BRIDGE = "strata0"
NODE_ADDRESS = "10.88.0.1"
POD_PREFIX_LENGTH = 16
SERVICE_ADDRESS = "10.96.0.1"  # the `kubernetes` Service's ClusterIP (first of --service-cluster-ip-range)
CLUSTER_DNS = "10.96.0.10"  # the `kube-dns` Service's ClusterIP in the cluster profile, as kubeadm picks it
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "strata.local/pause:3.10"
NODE_LABEL = {"type": "real"}
TAINT = {"key": "strata.dev/real-node", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"], "effect": TAINT["effect"]}
POD_PIDS_LIMIT = 4096  # an update's pulumi, language host and provider plugins use a few hundred
KUBELET_SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")
FORWARDING_SYSCTL = "net.ipv4.ip_forward"  # Service traffic between pods is routed through the host
RECORDED_SYSCTLS = (*KUBELET_SYSCTLS, FORWARDING_SYSCTL)
IPTABLES = ("iptables", "ip6tables")
HOST_DIRS = ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods")
NETNS_DIR = Path("/run/netns")
POD_NETNS_PREFIX = "cni-"  # how the CNI plugins name a pod's network namespace
HOST_RECORD = Path("/run/strata/host.json")  # in /run: gone on reboot, as every change it records is
CNI_BIN_DIR = Path("/usr/lib/cni")
# A real node's runtime and network, plus what builds images for it (mmdebstrap; gcc for the pause image),
# the headless browser the console's integration test drives (with a font for its screenshots), and the
# sandbox the process executor runs teams' programs in (bubblewrap).
DEBIAN_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables", "iproute2", "mmdebstrap",
                   "gcc", "libc6-dev", "chromium", "chromium-driver", "fonts-dejavu-core", "bubblewrap")
GATEWAY_PROCESS = "node-gateway"


class RealNodeError(Exception):
    """A real node could not start or stop; the message names the cause and the fix."""


def missing_requirements(kubelet: Path | None) -> list[str]:
    """Why a real node cannot start on this machine (empty: it can)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (kubelet mounts volumes, creates cgroups and iptables chains): run as root")
    tools = {"containerd": "containerd", "runc": "runc", "ctr": "containerd", "iptables": "iptables",
             "ip": "iproute2"}
    absent = sorted({package for tool, package in tools.items() if shutil.which(tool) is None}
                    | ({"containernetworking-plugins"} if not (CNI_BIN_DIR / "bridge").exists() else set()))
    if absent:
        missing.append(f"Debian packages {', '.join(absent)}: apt-get install -y {' '.join(absent)}")
    if kubelet is None or not kubelet.exists():
        missing.append("kubelet in the toolchain: run `make setup`")
    if not Path("/sys/fs/cgroup").is_dir():
        missing.append("cgroups mounted at /sys/fs/cgroup")
    return missing


def missing_debian_packages() -> list[str]:
    result = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\\n", *DEBIAN_PACKAGES],
                            capture_output=True, text=True, check=False)
    installed = {line.split()[0] for line in result.stdout.splitlines() if line.endswith(" installed")}
    return [package for package in DEBIAN_PACKAGES if package not in installed]


def ensure_debian_packages(say) -> bool:
    """Install what real nodes need from Debian's packages where this user may (root with apt-get); else
    name the command. True when everything is installed."""
    missing = missing_debian_packages() if shutil.which("dpkg-query") else list(DEBIAN_PACKAGES)
    if not missing:
        say(f"host packages (real nodes, the console's browser test, the process executor's sandbox): all installed "
            f"({', '.join(DEBIAN_PACKAGES)})")
        return True
    command = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        say(f"real nodes, the console's browser test and the process executor's sandbox of teams' programs need "
            f"Debian packages: {' '.join(command)} (as root); kwok nodes work without")
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    say(f"installing Debian packages for real nodes, the console's browser test and the process executor's "
        f"sandbox: {' '.join(missing)}")
    for attempt in (command, ["apt-get", "update", "-q"], command):  # stale package lists: update once, retry
        result = subprocess.run(attempt, capture_output=True, text=True, env=env, check=False)
        if result.returncode == 0 and attempt is command and not missing_debian_packages():
            say("  installed")
            return True
    say(f"  could not install them: {(result.stderr or result.stdout).strip().splitlines()[-1:]}; "
        f"run `{' '.join(command)}`; real-node tests report NOT RUN and the console's browser test fails until then")
    return False


@dataclasses.dataclass(frozen=True)
class RealNode:
    """One kubelet and its containerd, in `<state>/nodes/<name>/`."""

    name: str
    index: int
    directory: Path
    kubelet_port: int
    healthz_port: int

    @property
    def runtime_dir(self) -> Path:
        """Sockets live in /run: a unix socket path may not exceed 107 bytes, state directories can."""
        digest = hashlib.sha256(str(self.directory).encode()).hexdigest()[:12]
        return Path("/run/strata") / digest

    @property
    def containerd_socket(self) -> Path:
        return self.runtime_dir / "containerd.sock"

    @property
    def certs_dir(self) -> Path:
        """containerd's registry host configuration, one directory per registry."""
        return self.directory / "certs.d"

    @property
    def cgroup_root(self) -> str:
        return f"/strata-{self.name}"

    @property
    def pod_range(self) -> tuple[str, str]:
        return f"10.88.{self.index + 1}.2", f"10.88.{self.index + 1}.254"


def build_containerd_config(node: RealNode) -> str:
    """containerd 1.6 (config v2) owning nothing outside the node's directory and runtime dir."""
    d = node.directory / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join([
        "version = 2",
        f'root = "{d / "root"}"',
        f'state = "{node.runtime_dir / "state"}"',
        "[grpc]", f'  address = "{node.containerd_socket}"',
        "[ttrpc]", f'  address = "{node.containerd_socket}.ttrpc"',
        '[plugins."io.containerd.internal.v1.opt"]', f'  path = "{d / "opt"}"',
        f"[{cri}]",
        f'  sandbox_image = "{PAUSE_IMAGE}"',
        # Without CAP_SYS_RESOURCE (VMs like this one) every sandbox fails with "can't get final
        # child's PID from pipe" unless containerd keeps oom_score_adj within what it may set.
        "  restrict_oom_score_adj = true",
        # Registry host configuration (hosts.toml per registry): the cluster profile's registry, in plain HTTP.
        f"[{cri}.registry]", f'  config_path = "{node.certs_dir}"',
        f"[{cri}.cni]", f'  bin_dir = "{CNI_BIN_DIR}"', f'  conf_dir = "{node.directory / "cni"}"',
        f"[{cri}.containerd.runtimes.runc]", '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]", "  SystemdCgroup = false",
        "",
    ])


def build_cni_config(node: RealNode) -> dict:
    """Pods on the shared bridge, each node handing out addresses from its own /24."""
    start, end = node.pod_range
    return {
        "cniVersion": "1.0.0", "name": "strata",
        "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(node.directory / "ipam"),
                     "ranges": [[{"subnet": f"10.88.0.0/{POD_PREFIX_LENGTH}", "rangeStart": start,
                                  "rangeEnd": end, "gateway": NODE_ADDRESS}]],
                     "routes": [{"dst": "0.0.0.0/0"}]},
        }, {"type": "loopback"}],
    }


# systemd-resolved's list of the upstream servers, which its stub at 127.0.0.53 forwards to.
RESOLVED_UPSTREAMS = Path("/run/systemd/resolve/resolv.conf")


def host_resolver_file(host_resolv_conf: str, resolved_upstreams_exist: bool) -> str:
    """The host's resolver as a pod reaches it (kubelet's resolvConf: CoreDNS's upstream, and the dev profile's
    pods' resolver). A loopback nameserver (systemd-resolved's stub) is the pod's own loopback there, which
    CoreDNS would forward to itself: then the upstreams behind the stub, as kubeadm does."""
    servers = [line.split()[1] for line in host_resolv_conf.splitlines()
               if line.split()[:1] == ["nameserver"] and len(line.split()) > 1]
    if servers and all(s.startswith("127.") or s == "::1" for s in servers) and resolved_upstreams_exist:
        return str(RESOLVED_UPSTREAMS)
    return "/etc/resolv.conf"


def build_kubelet_config(node: RealNode, ca_file: Path, cluster_dns: str | None = None,
                         resolv_conf: str = "/etc/resolv.conf") -> dict:
    """`cluster_dns`: the DNS add-on's Service address written into pods' resolv.conf (none: the host's).
    `resolv_conf`: the host's resolver file (host_resolver_file)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": NODE_ADDRESS, "port": node.kubelet_port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": node.healthz_port,
        # Only the apiserver (its kubelet-client certificate) and RBAC-checked callers get in.
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        # cgroups v1 here, no systemd: cgroupfs, under a root of the node's own.
        "cgroupDriver": "cgroupfs", "cgroupRoot": node.cgroup_root, "failCgroupV1": False,
        "failSwapOn": False,
        "podLogsDir": str(node.directory / "pod-logs"),
        "registerWithTaints": [TAINT],
        "clusterDomain": CLUSTER_DOMAIN,
        **({"clusterDNS": [cluster_dns]} if cluster_dns else {}),
        "resolvConf": resolv_conf,
        "makeIPTablesUtilChains": False,
        # A developer's disk is often fuller than a server's: evict only when it is really full.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%",
                         "nodefs.inodesFree": "2%"},
        "imageGCHighThresholdPercent": 99, "imageGCLowThresholdPercent": 98,
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        # Kubernetes has no per-pod field for it: the kubelet caps every pod's processes, so a fork bomb in a
        # team's workspace pod (or any pod) exhausts its own PIDs, not the node's.
        "podPidsLimit": POD_PIDS_LIMIT,
    }


def kubelet_process(node: RealNode, kubelet: Path) -> HostProcess:
    labels = ",".join(f"{k}={v}" for k, v in NODE_LABEL.items())
    return HostProcess(f"kubelet-{node.name}", [
        str(kubelet), f"--config={node.directory / 'kubelet.yaml'}",
        f"--kubeconfig={node.directory / 'kubeconfig'}", f"--root-dir={node.directory / 'kubelet'}",
        f"--cert-dir={node.directory / 'kubelet-pki'}", f"--node-ip={NODE_ADDRESS}",
        f"--hostname-override={node.name}", f"--node-labels={labels}", "--v=1",
    ])


def containerd_process(node: RealNode) -> HostProcess:
    return HostProcess(f"containerd-{node.name}", ["/usr/bin/containerd",
                                                  f"--config={node.directory / 'containerd.toml'}"])


# -- host changes ---------------------------------------------------------------------------------

def _run(*argv: str, check: bool = True) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RealNodeError(f"`{' '.join(argv)}` failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


def _succeeds(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def _iptables_chains(binary: str = "iptables") -> dict[str, list[str]]:
    chains = {}
    if shutil.which(binary) is None:
        return chains
    for table in ("filter", "nat", "mangle"):
        out = _run(binary, "-t", table, "-S", check=False)
        chains[table] = sorted(line.split()[1] for line in out.splitlines() if line.startswith("-N "))
    return chains


def _read_sysctl(name: str) -> str:
    return Path("/proc/sys", *name.split(".")).read_text().strip()


def pod_network_namespaces() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.glob(f"{POD_NETNS_PREFIX}*")) if NETNS_DIR.is_dir() else []


def claim_host(state: Path, run_dir: Path, say, extra_processes: tuple[str, ...] = ()) -> None:
    """Record what the host looks like before this platform's first real node starts (kept until its last one
    stops). Refused while another platform's real nodes run; the record of one that no longer runs (killed
    with its nodes, as a machine's session end kills every process) is undone first."""
    if HOST_RECORD.exists():
        record = json.loads(HOST_RECORD.read_text())
        if record["owner"] == str(state):
            return
        owner, owner_run_dir = Path(record["owner"]), Path(record["run_dir"])
        if processes.running_pid(owner_run_dir, GATEWAY_PROCESS) is not None:
            raise RealNodeError(f"another local platform on this host runs real nodes (its state: {owner}); they "
                                f"share the host's pod bridge: stop it first (strata local down --state-dir {owner}), "
                                "or start this one without --real-nodes")
        say(f"  undoing what the real nodes of a platform that no longer runs left on the host (its state: {owner})")
        stop_nodes(owner, owner_run_dir, say, extra_processes)
    record = {"owner": str(state), "run_dir": str(run_dir),
              "sysctls": {name: _read_sysctl(name) for name in RECORDED_SYSCTLS},
              **{binary: _iptables_chains(binary) for binary in IPTABLES},
              "dirs": [path for path in HOST_DIRS if Path(path).exists()], "netns": pod_network_namespaces()}
    HOST_RECORD.parent.mkdir(parents=True, exist_ok=True)
    HOST_RECORD.write_text(json.dumps(record, indent=1))


def ensure_bridge() -> None:
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    addresses = _run("ip", "-o", "addr", "show", "dev", BRIDGE)
    for address in (f"{NODE_ADDRESS}/{POD_PREFIX_LENGTH}", f"{SERVICE_ADDRESS}/32"):
        if f" {address} " not in addresses:
            _run("ip", "addr", "add", address, "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve())
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            mounts.append(point)
    return mounts


def kill_containers(node: RealNode) -> int:
    """Kill what runs in the node's pods (their cgroups) and containerd's shims for the node."""
    victims = set()
    socket = str(node.containerd_socket)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroups = (entry / "cgroup").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        in_node = any(line.split(":", 2)[-1].startswith(node.cgroup_root + "/") for line in cgroups.splitlines())
        shim = argv[0].endswith(b"containerd-shim-runc-v2") and socket.encode() in b" ".join(argv)
        if in_node or shim:
            victims.add(int(entry.name))
    for pid in victims:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    # Mounts held by a dying process are busy until it is gone.
    processes.wait_until(lambda: not any(_running(pid) for pid in victims), timeout=10,
                         what="container processes gone after SIGKILL")
    return len(victims)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def unmount_under(root: Path) -> None:
    for point in sorted(_mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def ensure_cgroups(node: RealNode) -> None:
    """kubelet wants its cgroup root present in every hierarchy (cgroups v1 here)."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if not (hierarchy / "cgroup.procs").exists():
            continue
        top = hierarchy / node.cgroup_root.lstrip("/")
        top.mkdir(exist_ok=True)
        for inherited in ("cpuset.cpus", "cpuset.mems"):  # an empty cpuset admits no process
            if (top / inherited).exists() and not (top / inherited).read_text().strip():
                (top / inherited).write_text((hierarchy / inherited).read_text())


def remove_cgroups(node: RealNode) -> None:
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / node.cgroup_root.lstrip("/")
        if not top.is_dir():
            continue
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                                reverse=True) + [top]:
            try:
                directory.rmdir()
            except OSError:
                pass


def _remove_added_chains(binary: str, before: dict[str, list[str]]) -> list[str]:
    """Remove the chains that were not there before, with every rule jumping to them; what stays."""
    left = []
    for table, chains in _iptables_chains(binary).items():
        added = [chain for chain in chains if chain not in before.get(table, [])]
        for chain in added:  # first every reference, then the chains themselves
            _succeeds(binary, "-t", table, "-F", chain)
        for line in _run(binary, "-t", table, "-S", check=False).splitlines():
            words = shlex.split(line)  # kube-proxy's rules carry quoted comments with spaces
            targets = {words[i + 1] for i, word in enumerate(words[:-1]) if word in ("-j", "-g")}
            if words[:1] == ["-A"] and targets & set(added):
                _succeeds(binary, "-t", table, "-D", *words[1:])
        for chain in added:
            if not _succeeds(binary, "-t", table, "-X", chain):
                left.append(f"{binary} chain {table}/{chain}")
    return left


def restore_host(state: Path) -> list[str]:
    """Undo what the nodes of the platform in `state` changed on the host; returns what could not be undone."""
    if not HOST_RECORD.exists():
        return []
    record = json.loads(HOST_RECORD.read_text())
    if record["owner"] != str(state):
        return []
    left = []
    for name, value in record["sysctls"].items():
        if _read_sysctl(name) != value and not _succeeds("sysctl", "-q", "-w", f"{name}={value}"):
            left.append(f"sysctl {name} (was {value})")
    for binary in IPTABLES:
        left += _remove_added_chains(binary, record[binary])
    for netns in sorted(set(pod_network_namespaces()) - set(record["netns"])):
        if not _succeeds("ip", "netns", "delete", netns):
            left.append(f"network namespace {netns}")
    if Path(f"/sys/class/net/{BRIDGE}").exists() and not _succeeds("ip", "link", "delete", BRIDGE):
        left.append(f"network bridge {BRIDGE}")
    for path in HOST_DIRS:
        if path not in record["dirs"] and Path(path).exists():
            unmount_under(Path(path))
            shutil.rmtree(path, ignore_errors=True)
            if Path(path).exists():
                left.append(path)
    HOST_RECORD.unlink()
    return left


# -- lifecycle ------------------------------------------------------------------------------------

def node_dirs(state: Path) -> list[Path]:
    root = state / "nodes"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def load_node(directory: Path) -> RealNode:
    record = json.loads((directory / "node.json").read_text())
    return RealNode(name=record["name"], index=record["index"], directory=directory,
                    kubelet_port=record["kubelet_port"], healthz_port=record["healthz_port"])


UNIX_SOCKET_PATH_MAX = 107


def node_directory(state: Path, index: int) -> Path:
    return state / "nodes" / f"real-{index}"


def socket_path_problem(state: Path, nodes: int) -> str | None:
    """Why kubelet could not create its unix sockets below the nodes' directories (its --root-dir, where
    a socket's path may not exceed 107 bytes), naming the fix; None when it can."""
    deepest = node_directory(state, nodes - 1) / "kubelet" / "device-plugins" / "kubelet.sock"
    size = len(str(deepest).encode())
    if size <= UNIX_SOCKET_PATH_MAX:
        return None
    longest = len(str(state).encode()) - (size - UNIX_SOCKET_PATH_MAX)
    return (f"the state directory {state} is too long for kubelet's unix sockets ({deepest} is {size} bytes, at "
            f"most {UNIX_SOCKET_PATH_MAX}): use one of at most {longest} bytes (STRATA_HOME for make up, "
            "--state-dir for strata local up)")


def prepare_node(state: Path, index: int, pki: Path, kubeconfig_builder, cluster_dns: str | None = None,
                 registry_port: int | None = None) -> RealNode:
    """The node's directory, configs and client certificate (ports allocated once, kept in node.json)."""
    name = f"real-{index}"
    directory = node_directory(state, index)
    if (directory / "node.json").exists():
        node = load_node(directory)
    else:
        kubelet_port, healthz_port = processes.free_ports(2)
        node = RealNode(name=name, index=index, directory=directory, kubelet_port=kubelet_port,
                        healthz_port=healthz_port)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "node.json").write_text(json.dumps(
            {"name": name, "index": index, "kubelet_port": kubelet_port, "healthz_port": healthz_port}))
    issue_client_certificate(pki, f"node-{name}", f"system:node:{name}", "system:nodes")
    write_private(directory / "kubeconfig", kubeconfig_builder(f"node-{name}"))
    (directory / "containerd.toml").write_text(build_containerd_config(node))
    resolv_conf = host_resolver_file(Path("/etc/resolv.conf").read_text(), RESOLVED_UPSTREAMS.exists())
    (directory / "kubelet.yaml").write_text(yaml.safe_dump(build_kubelet_config(node, pki / "ca.crt", cluster_dns,
                                                                                resolv_conf)))
    node.certs_dir.mkdir(exist_ok=True)
    if registry_port is not None:
        from .registry import write_containerd_hosts

        write_containerd_hosts(node.certs_dir, registry_port)
    (directory / "cni").mkdir(exist_ok=True)
    (directory / "cni" / "10-strata.conflist").write_text(json.dumps(build_cni_config(node), indent=1))
    node.runtime_dir.mkdir(parents=True, exist_ok=True)
    ensure_cgroups(node)
    return node


def stop_nodes(state: Path, run_dir: Path, say, extra_processes: tuple[str, ...] = ()) -> list[str]:
    """Stop every real node, then `extra_processes` (kube-proxy) and the gateway, then undo what they changed
    on the host."""
    stopped = []
    nodes = [load_node(d) for d in node_dirs(state) if (d / "node.json").exists()]
    for node in nodes:
        if processes.stop(run_dir, f"kubelet-{node.name}"):
            stopped.append(f"kubelet-{node.name}")
        killed = kill_containers(node)
        if processes.stop(run_dir, f"containerd-{node.name}"):
            stopped.append(f"containerd-{node.name}")
        kill_containers(node)  # a shim that outlived containerd
        unmount_under(node.runtime_dir)
        unmount_under(node.directory)
        remove_cgroups(node)
        shutil.rmtree(node.runtime_dir, ignore_errors=True)
        say(f"  stopped real node {node.name} ({killed} container process(es) killed)")
    for name in (*extra_processes, GATEWAY_PROCESS):
        if processes.stop(run_dir, name):
            stopped.append(name)
    left = restore_host(state)
    if left:
        say(f"  could not undo on the host: {', '.join(left)}")
    with contextlib.suppress(OSError):
        HOST_RECORD.parent.rmdir()  # /run/strata, when nothing of another platform is in it
    return stopped
