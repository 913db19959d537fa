"""What the operator checks before Kopf starts: its ports bindable, its credentials accepted, its CRDs
served, its leader Lease readable and writable. Each cause found is one line naming it and the fix, and
the process exits 1 before it has started anything (no Kopf retry loop, no worker left behind).

An API server that does not answer, or answers 5xx/429, is not a cause: the checks wait for it (saying
so), since the operator would only be restarted into the same wait. The pure halves (`build_*_failures`)
turn answers into causes; `check` asks the questions.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping

from ..api import AUTO_GROUP, AUTO_VERSION, GROUP, VERSION

logger = logging.getLogger(__name__)

# Every API the operator's handlers watch: without one of them Kopf would only log an error per watch.
REQUIRED_RESOURCES = {f"{GROUP}/{VERSION}": ("stacks", "programs"),
                      f"{AUTO_GROUP}/{AUTO_VERSION}": ("workspaces", "updates")}
LEASE_VERBS = ("get", "create", "update")
CRDS_FIX = ("apply the operator's CRDs (operator/strata_operator/api/crds/*.yaml, as the Operator component "
            "does: kubectl apply --server-side -f operator/strata_operator/api/crds/) and wait until they are "
            "Established")
# How long to wait for an API server that does not answer yet, and how often to say so.
API_WAIT_SECONDS = 300.0
API_RETRY_SECONDS = 2.0
API_REPEAT_SECONDS = 30.0
REQUEST_TIMEOUT = (5.0, 15.0)
# An API server that has just started answers before its caches are synced: 403 to everything RBAC
# would allow, 404 for CRDs. A cause is one only if it still holds this long after it was first seen
# (seen: an apiserver restarted under a waiting operator refused its first check with 403, and it exited).
CAUSE_SETTLE_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class Failure:
    """One reason the operator cannot start, and what to do about it."""

    cause: str
    fix: str

    def line(self) -> str:
        return f"cannot start: {self.cause}; fix: {self.fix}"


class ApiUnavailable(Exception):
    """The API server did not answer, or answered 5xx/429: wait, do not report a cause."""


@dataclasses.dataclass(frozen=True)
class PortSetting:
    flag: str
    port: int
    what: str
    address: str = "0.0.0.0"
    """The address its server binds."""


def build_port_failures(settings: Iterable[PortSetting],
                        bind_error: Callable[[str, int], int | None]) -> list[Failure]:
    """A failure per port that `bind_error` (errno or None) says cannot be bound; port 0 is off."""
    failures = []
    for setting in settings:
        if not setting.port:
            continue
        code = bind_error(setting.address, setting.port)
        if code is None:
            continue
        why = "is already in use on this host" if code == errno.EADDRINUSE else \
            f"cannot be bound ({errno.errorcode.get(code, code)})"
        failures.append(Failure(f"the {setting.what} port {setting.port} ({setting.flag}) {why}",
                                f"stop what listens there, or give {setting.flag} a free port "
                                f"({setting.flag} 0 turns it off)"))
    return failures


def bind_error(address: str, port: int) -> int | None:
    """None if `port` can be bound on `address` now, as its server binds it, else the errno."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server and aiohttp do
        try:
            probe.bind((address, port))
        except OSError as err:
            return err.errno or errno.EADDRINUSE
    return None


def build_credential_failure(status: int, message: str, server: str) -> Failure | None:
    """The answer to an authenticated request (the first one made) as a failure, or None if accepted."""
    if status == 401:
        return Failure(f"the API server {server} does not accept the operator's credentials ({message})",
                       "give the operator a current token or certificate: --kubeconfig or KUBECONFIG with a valid "
                       "user, or in a pod its ServiceAccount's token")
    return None


def build_crd_failures(served: Mapping[str, set[str] | None]) -> list[Failure]:
    """A failure per API group/version the server does not serve (None) or serves without a resource."""
    failures = []
    for group_version, resources in REQUIRED_RESOURCES.items():
        have = served.get(group_version)
        missing = [r for r in resources if have is None or r not in have]
        if missing:
            names = ", ".join(f"{r}.{group_version.split('/')[0]}" for r in missing)
            failures.append(Failure(f"the API server does not serve {group_version} {names} (CRD missing)",
                                    CRDS_FIX))
    return failures


def build_lease_failure(allowed: Mapping[str, bool], namespace: str, name: str) -> Failure | None:
    """The SelfSubjectAccessReview answers per verb on the Lease as a failure, or None if all are allowed."""
    denied = [verb for verb in LEASE_VERBS if not allowed.get(verb)]
    if not denied:
        return None
    return Failure(f"the operator may not {'/'.join(denied)} its leader Lease {namespace}/{name} "
                   "(coordination.k8s.io leases)",
                   f"grant get, create and update on coordination.k8s.io leases in namespace {namespace} "
                   "(operator/strata_operator/api/rbac/leader-election.yaml), set --leader-election-namespace to "
                   "the namespace that Role is in, or run one replica with --no-leader-election")


@dataclasses.dataclass(frozen=True)
class PreflightSettings:
    ports: tuple[PortSetting, ...]
    kubeconfig: str | None
    lease: tuple[str, str] | None
    """(namespace, name) of the leader Lease; None without leader election."""


class _Api:
    """The few requests of the checks, with the client the handlers will use."""

    def __init__(self, kubeconfig: str | None):
        from ..services.kube import Kube

        self.api = Kube.from_environment(kubeconfig).api
        self.server = self.api.configuration.host

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """(status, JSON body) of a 2xx or 4xx answer; ApiUnavailable for no answer, 5xx or 429."""
        from kubernetes.client.rest import ApiException

        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            request = self.api.param_serialize(method=method, resource_path=path, header_params=headers, body=body,
                                               auth_settings=["BearerToken"])
            response = self.api.call_api(*request, _request_timeout=REQUEST_TIMEOUT)
            response.read()
            status, data = response.status, response.data
        except ApiException as err:
            status, data = err.status, err.body
        except Exception as err:  # noqa: BLE001 - connection refused, TLS, timeouts: the server is not there yet
            raise ApiUnavailable(f"{type(err).__name__}: {err}") from None
        if status >= 500 or status == 429:
            raise ApiUnavailable(f"HTTP {status}")
        try:
            return status, json.loads(data or b"{}")
        except ValueError:
            return status, {}

    def served(self, group_version: str) -> set[str] | None:
        status, found = self.call("GET", f"/apis/{group_version}")
        if status == 404:
            return None
        if status >= 400:
            raise _Answered(status, found)
        return {r["name"] for r in found.get("resources", []) if "/" not in r["name"]}

    def allowed(self, namespace: str, verb: str, group: str, resource: str) -> bool:
        status, found = self.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "group": group,
                                            "resource": resource}}})
        if status >= 400:
            raise _Answered(status, found)
        return bool((found.get("status") or {}).get("allowed"))


class _Answered(Exception):
    """A 4xx answer where none was expected: 401 is the credentials, anything else is named as is."""

    def __init__(self, status: int, body: dict):
        super().__init__(status)
        self.status, self.message = status, body.get("message") or f"HTTP {status}"


def _api_failures(settings: PreflightSettings, wait: bool) -> list[Failure]:
    try:
        api = _Api(settings.kubeconfig)
    except Exception as err:  # noqa: BLE001 - kubeconfig missing or unreadable
        return [Failure(f"no usable Kubernetes credentials ({type(err).__name__}: {err})",
                        "pass --kubeconfig or set KUBECONFIG to a kubeconfig for the operator, or run it in a pod "
                        "with a ServiceAccount")]
    waited_since, said, found_since = time.monotonic(), 0.0, None
    # urllib3 logs each of its own retries of a refused connection: the wait below says it once.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    while True:
        try:
            failures = _ask(api, settings)
        except ApiUnavailable as err:
            if not wait:
                return []
            now = time.monotonic()
            if now - waited_since > API_WAIT_SECONDS:
                return [Failure(f"the API server {api.server} did not answer for {API_WAIT_SECONDS:.0f} s ({err})",
                                "start it, or point --kubeconfig at a cluster that runs")]
            if now - said >= API_REPEAT_SECONDS:
                logger.warning("waiting for the API server %s before starting: %s", api.server, err)
                said = now
            time.sleep(API_RETRY_SECONDS)
            continue
        if not failures or not wait:
            return failures
        found_since = found_since or time.monotonic()
        if time.monotonic() - found_since >= CAUSE_SETTLE_SECONDS:
            return failures
        time.sleep(API_RETRY_SECONDS)


def _ask(api: _Api, settings: PreflightSettings) -> list[Failure]:
    failures: list[Failure] = []
    try:
        if settings.lease is not None:  # the first request also proves the credentials
            namespace, name = settings.lease
            lease = build_lease_failure({verb: api.allowed(namespace, verb, "coordination.k8s.io", "leases")
                                         for verb in LEASE_VERBS}, namespace, name)
            failures += [lease] if lease else []
        failures += build_crd_failures({gv: api.served(gv) for gv in REQUIRED_RESOURCES})
    except _Answered as err:
        credentials = build_credential_failure(err.status, err.message, api.server)
        failures.append(credentials or Failure(f"the API server {api.server} refused a check: HTTP {err.status} "
                                               f"{err.message}", "grant the operator's identity what its RBAC "
                                               "(operator/strata_operator/api/rbac/) lists"))
    return failures


def check(settings: PreflightSettings, bind: Callable[[str, int], int | None] = bind_error) -> list[Failure]:
    """Every cause that keeps the operator from starting (empty: go ahead). With a port failure already
    found, the API server is asked once, never waited for: that cause is said now."""
    ports = build_port_failures(settings.ports, bind)
    return [*ports, *_api_failures(settings, wait=not ports)]

