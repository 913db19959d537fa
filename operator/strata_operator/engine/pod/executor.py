"""The pod executor: `Engine` on one workspace pod per Stack (`--executor pod`).

Each operation: make sure the Stack's workspace exists as its spec says (ServiceAccount, agent Secret,
pod; a pod built from an older spec is replaced first), upload the program's source unless the pod
has it (a deterministic tarball, named by its sha256), then ask the pod's agent to run the operation.
What the Stack's Secrets hold never passes through here: the pod gets them from the kubelet.

The tarball is packed on the operator's source threads into a file beside the source, within the
operator's source size cap, and streamed from there to the agent (which streams it to its disk): no
source is ever held in the operator's memory. A tarball left beside a run's source says that the
operator died while packing or uploading it (`packed_source`: an OOM kill's recovery reads it).

A pod lost mid-operation (deleted, OOM-killed, its node restarted) ends the operation as interrupted
(`UpdateInterrupted`, retried at once); the next operation first clears what the lost run left in the
backend, the lock it took under the pod's hostname, exactly as after an operator restart.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import gzip
import hashlib
import json
import ssl
import tarfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from ...api import AUTO_GROUP, AUTO_VERSION, GROUP, VERSION
from ...api.status import OUT_OF_MEMORY, UPDATE_INTERRUPTED, WORKSPACE_FAILED
from ...api.workspace_template import ReservedPlacement, template_issues
from ...api.workspace_values import MountedRefs
from ...services.kube import Kube
from ...services.redaction import redactor_for
from ...sources.archive import SOURCE_CAP_HEADER, SizeCap, SourceTooLarge, byte_size
from ...sources.work import SourceWork
from ..port import RUNS_AGAIN, Operation, SerializedEngine, UpdateRequest, UpdateResult
from ..process.executor import EngineSettings
from .workspace_pod import (AGENT_PORT, WorkspaceCredentials, WorkspaceNames, WorkspacePodArgs, agent_started,
                            build_agent_secret, build_service_account, build_workspace_pod, last_termination,
                            mint_credentials, pod_problem, pod_ready, restarted, spec_hash)

# A pod whose container has not started yet is read again after POLL_SECONDS, then twice as long each time
# up to POLL_MAX_SECONDS: 50 pods starting on one busy node waited minutes, read twice a second each.
POLL_SECONDS, POLL_MAX_SECONDS = 0.5, 2.0
# A starting pod whose agent runs: its /healthz is asked after 0.1 s, then twice as long each time up to
# 1 s (on a busy node an agent takes tens of seconds to start: with 50 pods asked every 0.1 s the operator
# spent 22.9 s of CPU on a fill, 11.0 s so), and the pod is read again after every PROBE_READ_SECONDS of asking.
PROBE_SECONDS, PROBE_MAX_SECONDS, PROBE_READ_SECONDS = 0.1, 1.0, 2.0
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2)
# Updates run on the cluster's nodes, placed by its scheduler; the operator only waits on them.
DEFAULT_POD_CONCURRENCY = 50
CONTROL_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=10)


class WorkspaceError(Exception):
    """The workspace pod cannot be had; the message says why and names the Stack's field at fault."""


@dataclasses.dataclass(frozen=True)
class WorkspaceSettings:
    image: str
    """The operator image: its agent, pulumi CLI and language hosts run the updates."""
    image_pull_policy: str = "IfNotPresent"
    node_selector: dict[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    start_timeout_seconds: float = 300.0

    @property
    def reserved(self) -> ReservedPlacement:
        """What of a pod's placement is these settings' alone: no template may set or tolerate it."""
        return ReservedPlacement(frozenset(self.node_selector),
                                 frozenset(str(t["key"]) for t in self.tolerations if t.get("key")))


@dataclasses.dataclass
class Workspace:
    """A running workspace pod as the operator reaches it."""

    pod: str
    uid: str
    address: str
    server_name: str
    tls: ssl.SSLContext
    token: str = dataclasses.field(repr=False)
    restarts: int = 0

    def options(self) -> dict[str, Any]:
        """Every request's: the pinned certificate, the name it is for, the token."""
        return {"ssl": self.tls, "server_hostname": self.server_name,
                "headers": {"Authorization": f"Bearer {self.token}"}}


def packed_source(root: Path) -> Path:
    """Where the tarball of the source at `root` is packed for its upload: beside it, in its run's directory."""
    return root.with_name(root.name + ".tar.gz")


class _HashingWriter:
    """The tarball's file as gzip writes it: hashed and counted on the way, refused beyond the cap."""

    def __init__(self, out: Any, cap: SizeCap):
        self.out, self.cap, self.size, self.sha256 = out, cap, 0, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.cap.max_bytes:
            raise self.cap.refusal("the program's source, packed for its workspace pod,")
        self.sha256.update(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def source_archive(root: Path, archive: Path, cap: SizeCap = SizeCap()) -> str:
    """Write the source at `root` into `archive` as a gzipped tarball that depends on its content only
    (sorted, no times or owners, no .git), file by file as it is read; its sha256, which names it (the
    same program is uploaded once). SourceTooLarge once its files, or the tarball, pass the cap."""
    files = 0
    with archive.open("wb") as out:
        written = _HashingWriter(out, cap)
        with gzip.GzipFile(fileobj=written, mode="wb", mtime=0) as zipped, \
                tarfile.open(fileobj=zipped, mode="w") as tar:
            for path in sorted(root.rglob("*")):
                relative = path.relative_to(root)
                if ".git" in relative.parts:
                    continue
                info = tar.gettarinfo(str(path), arcname=relative.as_posix())
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if info.isfile():
                    files += info.size
                    if files > cap.max_bytes:
                        raise cap.refusal(f"the program's source ({byte_size(files)} of files at least)")
                    with open(path, "rb") as handle:
                        tar.addfile(info, handle)
                elif info.isdir() or info.issym():
                    tar.addfile(info)
    return written.sha256.hexdigest()


class PodEngine(SerializedEngine):
    """`Engine` on workspace pods, one per Stack, driven over HTTPS with a per-workspace token."""

    in_workspace_pods = True

    def __init__(self, settings: EngineSettings, workspace: WorkspaceSettings, kube: Kube,
                 sources: SourceWork | None = None):
        super().__init__(settings.concurrency)
        self.settings, self.workspace, self.kube = settings, workspace, kube
        self.sources = sources or SourceWork()
        self._running: dict[str, Workspace] = {}
        self._known: dict[str, Workspace] = {}
        self._http: tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession] | None = None

    async def start(self) -> None:
        """Nothing to start ahead: each Stack's pod starts with its first operation."""

    def _lock_host(self, stack_key: str, run_host: str) -> str:
        # Every run of the Stack takes its lock under its workspace pod's hostname, not the operator's.
        return WorkspaceNames.of(stack_key).pod

    async def prepare(self, request: UpdateRequest) -> str:
        """Start the workspace pod ahead of its first operation (a PKO Workspace turns Ready with its pod):
        why it cannot start, or ""."""
        async with self._locks.setdefault(request.stack_key, asyncio.Lock()):
            try:
                await self._workspace(request)
            except WorkspaceError as err:
                return redactor_for(WorkspaceNames.of(request.stack_key).namespace).redact(str(err))
        return ""

    def forget(self, stack_key: str) -> None:
        super().forget(stack_key)
        if not self.busy(stack_key):
            self._known.pop(stack_key, None)

    async def cancel(self, stack_key: str) -> bool:
        workspace = self._running.get(stack_key)
        if workspace is None:
            return False
        await self._control(workspace, "/cancel", {"stack_key": stack_key})
        return True

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._http is None or self._http[0] is not loop or self._http[1].closed:
            self._http = (loop, aiohttp.ClientSession())
        return self._http[1]

    async def _control(self, workspace: Workspace, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self._session().post(f"{workspace.address}{path}", json=body, timeout=CONTROL_TIMEOUT,
                                        **workspace.options()) as response:
            response.raise_for_status()
            return await response.json()

    async def _run_locked(self, operation: Operation, request: UpdateRequest) -> UpdateResult:
        started, started_at = time.monotonic(), time.time()
        workspace: Workspace | None = None
        try:
            workspace = await self._workspace(request)
            self._running[request.stack_key] = workspace
            answer = await self._operate(workspace, operation, request)
        except WorkspaceError as err:
            return UpdateResult("failed", str(err), reason=WORKSPACE_FAILED,
                                duration=time.monotonic() - started)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as err:
            # Nothing ran: the pod does not answer (its node restarting, say). Retried with backoff.
            # (A connect timeout is an asyncio.TimeoutError too: caught here, not as the operation's.)
            self._known.pop(request.stack_key, None)
            return UpdateResult("failed", f"the workspace pod does not answer: {err}",
                                reason=WORKSPACE_FAILED, duration=time.monotonic() - started)
        except asyncio.TimeoutError:
            if workspace is not None:
                await asyncio.shield(self._cancel_quietly(workspace, request.stack_key))
            return UpdateResult("failed", f"{operation} timed out after {self.settings.timeout_seconds:g}s",
                                duration=time.monotonic() - started)
        except aiohttp.ClientError as err:
            return await self._lost(request, operation, workspace, err, started, started_at)
        except asyncio.CancelledError:
            if workspace is not None:
                await asyncio.shield(self._cancel_quietly(workspace, request.stack_key))
            raise
        finally:
            self._running.pop(request.stack_key, None)
        result = UpdateResult.from_json(json.dumps(answer["result"]), time.monotonic() - started)
        if operation == "preview" and request.plan_file and answer.get("plan"):
            Path(request.plan_file).write_bytes(base64.b64decode(answer["plan"]))
        if operation == "up" and result.ok and request.reclaim_workspace:
            await self._reclaim(request)
        return result

    async def _cancel_quietly(self, workspace: Workspace, stack_key: str) -> None:
        try:
            await self._control(workspace, "/cancel", {"stack_key": stack_key})
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass  # the pod is gone: nothing runs to cancel

    async def _upload(self, workspace: Workspace, request: UpdateRequest) -> dict[str, str]:
        """The program's source in the pod (uploaded unless it has it): where the agent finds the project."""
        root = Path(request.source_root or request.project_dir)
        archive = packed_source(root)
        cap = self.sources.cap("the upload to the workspace pod")
        try:
            digest = await self.sources.run(WorkspaceNames.of(request.stack_key).namespace, source_archive, root,
                                            archive, cap)
            session = self._session()
            options = workspace.options()
            async with session.head(f"{workspace.address}/sources/{digest}", timeout=CONTROL_TIMEOUT,
                                    **options) as response:
                present = response.status == 200
            if not present:
                # Streamed from the file (aiohttp reads it a chunk at a time); the agent holds it to the same cap.
                options["headers"] = {**options["headers"], SOURCE_CAP_HEADER: str(cap.max_bytes)}
                with archive.open("rb") as tarball:
                    async with session.put(f"{workspace.address}/sources/{digest}", data=tarball,
                                           timeout=CONTROL_TIMEOUT, **options) as response:
                        if response.status >= 400:
                            raise WorkspaceError(f"the workspace refused the program's source: "
                                                 f"{await response.text()}")
        except SourceTooLarge as err:
            raise WorkspaceError(str(err)) from None
        finally:
            archive.unlink(missing_ok=True)
        return {"source": digest,
                "subdir": Path(request.project_dir).relative_to(root).as_posix() if request.source_root else "."}

    async def _operate(self, workspace: Workspace, operation: Operation, request: UpdateRequest) -> dict[str, Any]:
        session = self._session()
        tls = workspace.options()
        where = {"local_dir": request.local_dir} if request.local_dir else await self._upload(workspace, request)
        body: dict[str, Any] = {"operation": operation, **where, "request": json.loads(request.to_json(operation))}
        if request.plan_file and operation == "up" and Path(request.plan_file).is_file():
            body["plan"] = base64.b64encode(Path(request.plan_file).read_bytes()).decode()
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_seconds, sock_connect=10)
        async with session.post(f"{workspace.address}/run", json=body, timeout=timeout, **tls) as response:
            if response.status != 200:
                raise WorkspaceError(f"the workspace agent refused the {operation}: {response.status} "
                                     f"{(await response.text())[:300]}")
            return await response.json()

    async def _lost(self, request: UpdateRequest, operation: Operation, workspace: Workspace | None,
                    err: Exception, started: float, started_at: float) -> UpdateResult:
        """The connection to the pod broke mid-operation: say what happened to the pod."""
        names = WorkspaceNames.of(request.stack_key)
        self._known.pop(request.stack_key, None)
        pod = await self.kube.get_pod(names.namespace, names.pod)
        if workspace is None:
            what = f"the workspace pod could not be reached: {err}"
        elif pod is None or pod["metadata"]["uid"] != workspace.uid or pod["metadata"].get("deletionTimestamp"):
            what = f"the workspace pod {workspace.pod} was deleted"
        elif restarted(pod) > workspace.restarts:
            what = f"the workspace pod {workspace.pod} restarted ({last_termination(pod) or 'its node restarted'})"
        else:
            what = f"the connection to the workspace pod {workspace.pod} broke ({err})"
        if operation not in ("outputs", "recover"):
            self.lost_run(request.stack_key, names.pod, started_at)
        if pod is not None and last_termination(pod).startswith("OOMKilled") and restarted(pod) > workspace.restarts:
            # Run again at once, it would be killed again: a failure, retried with backoff once the limit is raised.
            return UpdateResult("failed", f"{what} during the {operation}: the workspace pod ran out of "
                                          f"memory; raise {names.resources_field}.limits.memory",
                                reason=OUT_OF_MEMORY, duration=time.monotonic() - started)
        return UpdateResult("failed", f"{what} during the {operation}{RUNS_AGAIN}",
                            reason=UPDATE_INTERRUPTED, duration=time.monotonic() - started)

    async def _reclaim(self, request: UpdateRequest) -> None:
        names = WorkspaceNames.of(request.stack_key)
        self._known.pop(request.stack_key, None)
        await self.kube.delete_pod(names.namespace, names.pod)

    async def _owner(self, names: WorkspaceNames) -> dict[str, Any] | None:
        """The ownerReference the workspace's objects carry; None while the owner is being deleted."""
        if names.is_workspace_object:
            owner = await self.kube.get_custom(AUTO_GROUP, AUTO_VERSION, "workspaces", names.namespace, names.owner)
            api_version, kind = f"{AUTO_GROUP}/{AUTO_VERSION}", "Workspace"
        else:
            owner = await self.kube.get_stack(names.namespace, names.owner)
            api_version, kind = f"{GROUP}/{VERSION}", "Stack"
        if owner is None:
            raise WorkspaceError(f"{kind} {names.namespace}/{names.owner} is gone")
        if owner["metadata"].get("deletionTimestamp"):
            return None
        return {"apiVersion": api_version, "kind": kind, "name": names.owner, "uid": owner["metadata"]["uid"],
                "controller": True}

    def _objects(self, names: WorkspaceNames) -> list[tuple[str, str]]:
        """(resource, name) of the workspace's objects: its pod, its agent Secret, its default ServiceAccount."""
        return [("pods", names.pod), ("secrets", names.agent_secret),
                *([("serviceaccounts", names.service_account)] if names.service_account else [])]

    async def _disown(self, names: WorkspaceNames) -> None:
        """Keep the workspace's objects from its owner's garbage collection while its finalizer destroys
        (see `owned_by`); `release` removes them."""
        for resource, name in self._objects(names):
            found = await self.kube.get_core(names.namespace, resource, name)
            if found is not None and found["metadata"].get("ownerReferences"):
                await self.kube.disown(names.namespace, resource, name)

    async def release(self, stack_key: str) -> None:
        """The owner's finalizer is done: remove the workspace objects its destroy kept from the garbage
        collector (those still owned go with their owner)."""
        names = WorkspaceNames.of(stack_key)
        self._known.pop(stack_key, None)
        for resource, name in self._objects(names):
            found = await self.kube.get_core(names.namespace, resource, name)
            if found is not None and not found["metadata"].get("ownerReferences"):
                await self.kube.delete_core(names.namespace, resource, name)

    def _desired_pod(self, request: UpdateRequest, owner: dict[str, Any] | None) -> dict[str, Any]:
        names = WorkspaceNames.of(request.stack_key)
        template = dict(request.workspace_template or {})
        # The controllers stall such a spec before any run; this holds for every other way to a pod (the
        # destroy of a Stack deleted before that check existed, a PKO Update).
        forbidden = template_issues(template.get("spec"), names.template_field, self.workspace.reserved)
        if forbidden:
            raise WorkspaceError("; ".join(str(issue) for issue in forbidden))
        service_account = (request.service_account or (template.get("spec") or {}).get("serviceAccountName")
                           or names.service_account or "default")
        return build_workspace_pod(WorkspacePodArgs(
            names=names, owner=owner, image=self.workspace.image,
            service_account=service_account, mounted=MountedRefs.from_json(request.mounted), template=template,
            image_pull_policy=self.workspace.image_pull_policy, node_selector=self.workspace.node_selector,
            tolerations=self.workspace.tolerations))

    async def _credentials(self, names: WorkspaceNames, owner: dict[str, Any] | None) -> WorkspaceCredentials:
        data = await self.kube.secret_bytes(names.namespace, names.agent_secret)
        credentials = WorkspaceCredentials.from_secret_data(data) if data is not None else None
        if credentials is None:
            credentials = mint_credentials(names.server_name)
            await self.kube.write_secret(names.namespace, names.agent_secret, credentials.secret_data(),
                                         build_agent_secret(names, owner, credentials)["metadata"]["labels"], owner)
        redactor_for(names.namespace).add(credentials.token)
        return credentials

    async def _workspace(self, request: UpdateRequest) -> Workspace:
        """The Stack's running workspace pod, created or replaced as needed; waits until its agent answers."""
        names = WorkspaceNames.of(request.stack_key)
        namespace = names.namespace
        pod = await self.kube.get_pod(namespace, names.pod)
        known = self._known.get(request.stack_key)
        desired = self._desired_pod(request, None)  # the spec hash leaves the owner out
        # A pod the garbage collector is deleting is never reused; one it leaves alone (its owner deleted in
        # the background, waiting for this finalizer) outlives the destroy as it is.
        if pod is not None and known is not None and pod["metadata"]["uid"] == known.uid and pod_ready(pod) \
                and not pod["metadata"].get("deletionTimestamp") and spec_hash(pod) == spec_hash(desired):
            # A restarted node can give the same pod a new address.
            known.address, known.restarts = f"https://{pod['status']['podIP']}:{AGENT_PORT}", restarted(pod)
            return known
        owner = await self._owner(names)
        if owner is None:
            await self._disown(names)
        desired = self._desired_pod(request, owner)
        if names.service_account and not request.service_account \
                and not (request.workspace_template.get("spec") or {}).get("serviceAccountName"):
            await self.kube.create_service_account(namespace, build_service_account(names, owner))
        credentials = await self._credentials(names, owner)
        if pod is not None and (spec_hash(pod) != spec_hash(desired) or pod["metadata"].get("deletionTimestamp")
                                or (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")):
            await self.kube.delete_pod(namespace, names.pod)
            await self._wait_gone(namespace, names.pod, pod["metadata"]["uid"])
            pod = None
        if pod is None:
            pod = await self.kube.create_pod(namespace, desired)
        tls = ssl.create_default_context(cadata=credentials.certificate)
        pod = await self._wait_ready(namespace, pod, MountedRefs.from_json(request.mounted),
                                     functools.partial(self._answers, tls=tls, server_name=names.server_name))
        workspace = Workspace(pod=names.pod, uid=pod["metadata"]["uid"],
                              address=f"https://{pod['status']['podIP']}:{AGENT_PORT}",
                              server_name=names.server_name, tls=tls, token=credentials.token,
                              restarts=restarted(pod))
        self._known[request.stack_key] = workspace
        return workspace

    async def _wait_gone(self, namespace: str, name: str, uid: str) -> None:
        deadline = time.monotonic() + self.workspace.start_timeout_seconds
        while time.monotonic() < deadline:
            pod = await self.kube.get_pod(namespace, name)
            if pod is None or pod["metadata"]["uid"] != uid:
                return
            await asyncio.sleep(POLL_SECONDS)
        raise WorkspaceError(f"the old workspace pod {namespace}/{name} did not go away within "
                             f"{self.workspace.start_timeout_seconds:g}s")

    async def _answers(self, pod: dict[str, Any], tls: ssl.SSLContext, server_name: str) -> bool:
        """The pod's agent answers its /healthz (as the kubelet's readiness probe asks it)."""
        try:
            async with self._session().get(f"https://{pod['status']['podIP']}:{AGENT_PORT}/healthz", ssl=tls,
                                           server_hostname=server_name, timeout=PROBE_TIMEOUT) as response:
                return response.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def _wait_ready(self, namespace: str, pod: dict[str, Any], mounted: MountedRefs,
                          answers: Callable[[dict[str, Any]], Awaitable[bool]]) -> dict[str, Any]:
        """The pod once it is Ready, or once its agent answers: a starting pod's agent is asked directly (from every
        PROBE_SECONDS to every PROBE_MAX_SECONDS), rather than waiting for the kubelet's next readiness probe and its
        status write."""
        name = pod["metadata"]["name"]
        deadline = time.monotonic() + self.workspace.start_timeout_seconds
        delay, poll = PROBE_SECONDS, POLL_SECONDS
        while True:
            if pod_ready(pod) and (pod.get("status") or {}).get("podIP"):
                return pod
            if agent_started(pod):
                asking = time.monotonic()
                while True:
                    if await answers(pod):
                        return pod
                    if time.monotonic() - asking >= PROBE_READ_SECONDS:
                        break
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, PROBE_MAX_SECONDS)
            problem = pod_problem(pod, mounted)
            if problem:
                raise WorkspaceError(problem)
            if time.monotonic() > deadline:
                raise WorkspaceError(f"the workspace pod {namespace}/{name} was not ready within "
                                     f"{self.workspace.start_timeout_seconds:g}s (phase "
                                     f"{(pod.get('status') or {}).get('phase', 'unknown')})")
            if not agent_started(pod):
                await asyncio.sleep(poll)
                poll = min(2 * poll, POLL_MAX_SECONDS)
            fresh = await self.kube.get_pod(namespace, name)
            if fresh is None:
                raise WorkspaceError(f"the workspace pod {namespace}/{name} was deleted while starting")
            pod = fresh
