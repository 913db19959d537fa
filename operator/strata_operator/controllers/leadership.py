"""Leader election, so that of several operator processes (Deployment replicas, a host process beside
a pod) only one handles Stacks: the Kopf wiring and the few Lease API calls around decisions/lease.py.

The startup handler blocks until this process holds the Lease, which holds back every Stack handler
(Kopf starts none before its startup handlers return); meanwhile a small stand-in answers the health
endpoint, so a standby is alive and never restarted by its probes. Once leading, a background task
renews the Lease. A leader that cannot renew within RENEW_DEADLINE_SECONDS kills its update workers,
before a standby may take over, and starts afresh in the same process as a standby (exits when not run
by the operator's main). On a clean stop the cleanup handler releases the Lease once the handlers have stopped, so a standby takes over
within RETRY_PERIOD_SECONDS instead of waiting for the Lease to lapse.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import sys
import time
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from ..decisions.lease import (DEFAULT_LEASE_NAME, LEASE_DURATION_SECONDS, RENEW_DEADLINE_SECONDS, RENEW_PERIOD_SECONDS,
                               RETRY_PERIOD_SECONDS, Decision, LeaseRecord, Observation, decide, lease_object, observe,
                               release_spec)
from ..services.kube import Kube
from ..services.redaction import LOG_REDACTOR

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "strata-system"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LABELS = {"app.kubernetes.io/name": "strata-operator", "app.kubernetes.io/part-of": "strata"}
# An error that persists is repeated at most this often while standing by or retrying.
REPEAT_ERROR_SECONDS = 60.0
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclasses.dataclass
class ElectionSettings:
    enabled: bool = True
    lease_name: str = DEFAULT_LEASE_NAME
    namespace: str = ""
    """Namespace of the Lease; empty: the pod's, else the kubeconfig context's, else strata-system."""
    kubeconfig: str | None = None
    health_endpoint: str | None = None
    """Kopf's liveness endpoint, answered by a stand-in while this process stands by."""
    restart_in_place: bool = False
    """On losing the Lease, start the operator afresh in this process (a standby again) instead of exiting."""


def check_settings(settings: ElectionSettings) -> None:
    """Raise SystemExit naming the flag when a Lease name or namespace cannot be an object name."""
    if not _NAME.match(settings.lease_name):
        raise SystemExit(f"--leader-election-lease {settings.lease_name!r} is not a valid object name: use "
                         "lowercase letters, digits, '-' and '.', e.g. strata-operator-leader")
    if settings.namespace and not _NAMESPACE.match(settings.namespace):
        raise SystemExit(f"--leader-election-namespace {settings.namespace!r} is not a valid namespace name: "
                         "use lowercase letters, digits and '-', e.g. strata-system")


def identity() -> str:
    """hostname_pid: unique per process across hosts and pods (a pod's hostname is its name)."""
    return f"{socket.gethostname()}_{os.getpid()}"


def discover_namespace(kubeconfig: str | None) -> tuple[str, str]:
    """(namespace, where it came from): the pod's own namespace in-cluster, else the kubeconfig's
    current-context namespace, else strata-system (the Operator component's default)."""
    with contextlib.suppress(OSError):
        found = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        if found:
            return found, "the pod's namespace"
    with contextlib.suppress(Exception):
        import kubernetes

        _, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
        found = ((active or {}).get("context") or {}).get("namespace") or ""
        if found:
            return found, "the kubeconfig's current context"
    return DEFAULT_NAMESPACE, "the default; set --leader-election-namespace to change it"


def describe_api_error(err: ApiException, namespace: str, name: str) -> str:
    """One line naming what failed and the fix; never the response headers."""
    try:
        message = json.loads(err.body or "{}").get("message") or err.reason
    except (TypeError, ValueError):
        message = err.reason
    if err.status in (401, 403):
        return (f"Lease {namespace}/{name}: {message}. Grant get, create and update on coordination.k8s.io "
                f"leases in namespace {namespace} (operator/strata_operator/api/rbac/leader-election.yaml), set "
                "--leader-election-namespace to the namespace that Role is in, or run one replica with "
                "--no-leader-election")
    if err.status == 404:
        return (f"Lease {namespace}/{name}: {message}. Create namespace {namespace} or set "
                "--leader-election-namespace to the operator's namespace")
    return f"Lease {namespace}/{name}: HTTP {err.status}: {message}"


def missing_namespace(err: ApiException) -> str:
    """The namespace a 404 says does not exist (writing an object into it), else ""."""
    if err.status != 404:
        return ""
    try:
        details = json.loads(err.body or "{}").get("details") or {}
    except (TypeError, ValueError, AttributeError):
        return ""
    return details.get("name", "") if details.get("kind") == "namespaces" else ""


def describe_namespace_error(err: ApiException, namespace: str) -> str:
    """Why the Lease's missing namespace could not be created, and the ways out."""
    why = "this operator may not create it" if err.status in (401, 403) else f"creating it failed (HTTP {err.status})"
    return (f"the leader Lease's namespace {namespace} does not exist and {why}: create it (kubectl create namespace "
            f"{namespace}), set --leader-election-namespace to an existing namespace whose Leases this operator may "
            "write, or run one replica with --no-leader-election")


class Elector:
    """One candidate for one Lease: reads it, decides (decisions/lease.py), writes."""

    def __init__(self, kube: Kube, namespace: str, name: str, me: str, restart_in_place: bool = False):
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, me
        self.restart_in_place = restart_in_place
        self.observation: Observation | None = None
        self.leading = False
        self.renewer: asyncio.Task | None = None

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def holder(self) -> str:
        record = self.observation.record if self.observation else None
        return record.holder if record else ""

    async def step(self) -> Decision:
        """Read the Lease, decide, and write what the decision says; raises ApiException when the write
        fails (409: another candidate wrote first)."""
        read = await self.kube.get_lease(self.namespace, self.name)
        self.observation = observe(self.observation, LeaseRecord.of(read), time.monotonic())
        decision = decide(self.observation, self.identity, time.monotonic(), datetime.now(timezone.utc))
        if decision.spec is None:
            return decision
        body = lease_object(self.namespace, self.name, decision.spec, read, LABELS)
        if read is None:
            written = await self.kube.create_lease(self.namespace, body)
        else:
            written = await self.kube.replace_lease(self.namespace, self.name, body)
        self.observation = observe(self.observation, LeaseRecord.of(written), time.monotonic())
        return decision

    async def release(self) -> bool:
        """Hand the Lease back if this process holds it; True if it did."""
        read = await self.kube.get_lease(self.namespace, self.name)
        spec = release_spec(LeaseRecord.of(read), self.identity, datetime.now(timezone.utc))
        if read is None or spec is None:
            return False
        await self.kube.replace_lease(self.namespace, self.name, lease_object(self.namespace, self.name, spec, read))
        return True

    def state(self) -> dict[str, Any]:
        return {"leading": self.leading, "identity": self.identity, "lease": self.lease,
                "holder": self.identity if self.leading else self.holder}


class _Repeats:
    """Log a recurring error once, then again only when it changes or every REPEAT_ERROR_SECONDS."""

    def __init__(self) -> None:
        self.last, self.at = "", 0.0

    def log(self, level: int, message: str) -> None:
        now = time.monotonic()
        if message != self.last or now - self.at >= REPEAT_ERROR_SECONDS:
            logger.log(level, "%s", LOG_REDACTOR.redact(message))
            self.last, self.at = message, now


async def acquire(elector: Elector) -> None:
    """Return once `elector` holds the Lease; until then stand by, saying who holds it."""
    errors = _Repeats()
    announced = None
    while True:
        decision: Decision | None = None
        try:
            decision = await elector.step()
        except ApiException as err:
            if missing_namespace(err) == elector.namespace:
                await create_lease_namespace(elector, errors)  # then the next try takes the Lease
            elif err.status != 409:  # 409: another candidate wrote between our read and write; look again
                problem = describe_api_error(err, elector.namespace, elector.name)
                errors.log(logging.ERROR, f"cannot take the leader {problem}; retrying")
        except Exception as err:  # noqa: BLE001 - apiserver unreachable, timeouts: keep trying
            errors.log(logging.WARNING,
                       f"cannot read the leader Lease {elector.lease}: {type(err).__name__}: {err}; retrying")
        if decision is not None and decision.action != "wait":
            elector.leading = True
            logger.info("leading: %s the Lease %s as %s; handling Stacks", _VERBS[decision.action], elector.lease,
                        elector.identity)
            return
        if decision is not None and decision.holder != announced:
            announced = decision.holder
            logger.info("standing by: the Lease %s is held by %s; this process (%s) handles no Stacks until that "
                        "holder releases it or does not renew it for %d s", elector.lease, decision.holder,
                        elector.identity, LEASE_DURATION_SECONDS)
        await asyncio.sleep(RETRY_PERIOD_SECONDS)


_VERBS = {"create": "created", "acquire": "took", "renew": "renewed"}


async def create_lease_namespace(elector: Elector, errors: _Repeats) -> None:
    """Create the Lease's namespace, which does not exist (a fresh cluster), or say why it cannot be.

    Never a fallback to another namespace: replicas started before and after someone created it would
    elect on different Leases, and both lead."""
    try:
        await elector.kube.create_namespace(elector.namespace, LABELS)
    except ApiException as err:
        if err.status != 409:  # 409: another replica created it first
            errors.log(logging.ERROR, f"cannot take the leader Lease {elector.lease}: "
                                      f"{describe_namespace_error(err, elector.namespace)}; retrying")
    except Exception as err:  # noqa: BLE001 - apiserver unreachable: the loop tries again
        errors.log(logging.WARNING, f"cannot create the namespace {elector.namespace} of the leader Lease: "
                                    f"{type(err).__name__}: {err}; retrying")
    else:
        logger.info("created the namespace %s for the leader Lease %s (it did not exist)", elector.namespace,
                    elector.lease)


async def keep(elector: Elector) -> None:
    """Renew every RENEW_PERIOD_SECONDS; stop the process once the Lease is lost or could not be
    renewed for RENEW_DEADLINE_SECONDS. Never returns normally (only cancelled, by the cleanup)."""
    renewed = time.monotonic()
    errors = _Repeats()
    period = RENEW_PERIOD_SECONDS
    try:
        while True:
            await asyncio.sleep(period)
            started = time.monotonic()
            left = renewed + RENEW_DEADLINE_SECONDS - started
            try:
                # Not wait_for: on Python 3.11 it can drop a cancel that races the step, and the cleanup that
                # cancelled this loop would then wait for it forever (seen under load).
                async with asyncio.timeout(max(left, 0.1)):
                    decision = await elector.step()
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                errors.log(logging.WARNING, f"could not renew the leader "
                           f"{describe_api_error(err, elector.namespace, elector.name)}; {max(left, 0):.0f} s left")
                decision = None
            except Exception as err:  # noqa: BLE001 - timeouts, connection errors: retry until the deadline
                errors.log(logging.WARNING, f"could not renew the leader Lease {elector.lease}: "
                           f"{type(err).__name__}: {err}; {max(left, 0):.0f} s left")
                decision = None
            if decision is not None and decision.action == "renew":
                renewed, period = started, RENEW_PERIOD_SECONDS
                continue
            if decision is not None:
                stop_handling(elector, f"the Lease {elector.lease} is now held by {decision.holder or 'nobody'}")
            if time.monotonic() - renewed >= RENEW_DEADLINE_SECONDS:
                stop_handling(elector, f"the Lease {elector.lease} could not be renewed for "
                                       f"{RENEW_DEADLINE_SECONDS:.0f} s")
            period = RETRY_PERIOD_SECONDS
    except asyncio.CancelledError:
        raise
    except BaseException as err:  # a bug here must not leave a leader that no longer renews
        stop_handling(elector, f"the Lease renewal failed: {type(err).__name__}: {err}")


def _descendants(root: int) -> list[int]:
    """Every live process below `root`, found through /proc (update workers are forked by the engine's
    fork server and lead their own sessions: neither process groups nor direct children find them)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_workers() -> int:
    """SIGKILL every process below the operator (the fork server, the update workers, their pulumi CLIs
    and plugins), each worker's process group too, for what was reparented; the number killed."""
    victims = _descendants(os.getpid())
    groups = set()
    for pid in victims:
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:
                groups.add(pid)
    for group in groups:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    killed = 0
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            killed += 1  # already taken down with its group
        except OSError:
            pass
    return killed


def stop_handling(elector: Elector, reason: str) -> None:
    """No longer the leader: stop every update now, before a standby may start its own, and start again as
    a standby in this process (the operator's run), else exit."""
    elector.leading = False
    killed = kill_workers()
    then = ("restarting in place as a standby (same process and log; it waits for the API server and the Lease)"
            if elector.restart_in_place else "exiting; a Deployment restarts this process as a standby")
    logger.critical("lost leadership: %s. %d worker process(es) killed so that no two operators run updates; %s",
                    reason, killed, then)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    if elector.restart_in_place:
        # A fresh image: Kopf's state, threads and sockets (not inherited) gone, the same pid, so whatever
        # supervises the process (the local platform, a kubelet) sees it running, never a crash loop. The
        # same identity leads again only if nobody took the Lease meanwhile.
        with contextlib.suppress(OSError):
            os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    os._exit(1)


class StandbyHealth:
    """Answers the health endpoint while the startup handler stands by (Kopf serves it only after
    startup): 200 with the election state, so probes keep a standby alive."""

    def __init__(self, endpoint: str | None, elector: Elector):
        self.endpoint, self.elector = endpoint, elector
        self.runner: Any = None

    async def start(self) -> None:
        if not self.endpoint:
            return
        from aiohttp import web

        parts = urllib.parse.urlsplit(self.endpoint)

        async def health(update_request: Any) -> Any:
            return web.json_response({"leader": self.elector.state()})

        app = web.Application()
        app.add_routes([web.get(parts.path or "/", health)])
        self.runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, parts.hostname, parts.port or 80).start()
        except OSError as err:
            logger.warning("cannot answer %s while standing by: %s", self.endpoint, err)
            await self.stop()

    async def stop(self) -> None:
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()


# --- Kopf wiring --------------------------------------------------------------------------------


@kopf.on.startup(errors=kopf.ErrorsMode.PERMANENT)
async def elect_leader(memo: kopf.Memo, **_: Any) -> None:
    """Block Kopf's start until this process holds the Lease, then keep renewing it."""
    if "ctx" not in memo:
        # An earlier startup handler failed for good (they run in order, this one last): the process exits
        # once the startup activity ends, which standing by for the Lease would put off indefinitely.
        return
    settings: ElectionSettings = memo.get("leader_election") or ElectionSettings(enabled=False)
    if not settings.enabled:
        logger.info("leader election is off (--no-leader-election): run no other operator on this cluster, or "
                    "both will run updates of the same Stacks")
        return
    namespace, source = (settings.namespace, "--leader-election-namespace") if settings.namespace else \
        discover_namespace(settings.kubeconfig)
    kube = Kube.from_environment(settings.kubeconfig)
    kube.executor = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="leader-lease")
    elector = Elector(kube, namespace, settings.lease_name, identity(), settings.restart_in_place)
    logger.info("leader election on the Lease %s (namespace from %s) as %s", elector.lease, source, elector.identity)
    standby = StandbyHealth(settings.health_endpoint, elector)
    await standby.start()
    try:
        await acquire(elector)
    except asyncio.CancelledError:
        # Stopped while standing by, or right after taking the Lease: hand it back if we got it.
        if elector.leading:
            with contextlib.suppress(Exception):
                await asyncio.shield(asyncio.wait_for(elector.release(), timeout=5))
        raise
    finally:
        await standby.stop()
    memo.elector = elector
    elector.renewer = asyncio.create_task(keep(elector), name="leader lease renewal")


@kopf.on.cleanup()
async def release_leadership(memo: kopf.Memo, **_: Any) -> None:
    """After the handlers stopped (Kopf runs cleanup last): stop renewing, make sure no update worker
    outlives the leadership, then hand the Lease back so a standby takes over now."""
    elector: Elector | None = memo.get("elector")
    if elector is None or not elector.leading:
        return
    if elector.renewer is not None:
        elector.renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await elector.renewer
    killed = kill_workers()  # a worker Kopf's shutdown left running must not overlap the next leader's
    if killed:
        # The engine's idle fork server is one of them: most shutdowns count 1 with no update running.
        logger.info("stopped %d process(es) below the operator (the engine's fork server, update workers left "
                    "running) before handing over", killed)
    elector.leading = False
    try:
        released = await asyncio.wait_for(elector.release(), timeout=5)
    except Exception as err:  # noqa: BLE001 - a standby still takes over once the Lease lapses
        logger.warning("could not release the Lease %s (%s); a standby takes over once it lapses (%d s)",
                       elector.lease, LOG_REDACTOR.redact(f"{type(err).__name__}: {err}"), LEASE_DURATION_SECONDS)
        return
    if released:
        logger.info("released the Lease %s: a standby takes over now", elector.lease)


@kopf.on.probe(id="leader")
def leader_probe(memo: kopf.Memo, **_: Any) -> dict[str, Any] | str:
    elector: Elector | None = memo.get("elector")
    return elector.state() if elector is not None else "off"
