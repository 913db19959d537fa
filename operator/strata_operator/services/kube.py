"""The few Kubernetes API calls the handlers make, off the event loop (the client is synchronous)."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import functools
import re
from typing import Any
from urllib.parse import quote

import kubernetes
import urllib3
import yaml
from kubernetes.client.rest import ApiException

from ..api import GROUP, VERSION
from . import api_health
from .redaction import add_operator_secrets

FLUX_GROUP = "source.toolkit.fluxcd.io"
FLUX_PLURALS = {"GitRepository": "gitrepositories", "OCIRepository": "ocirepositories", "Bucket": "buckets"}
LEASES = ("coordination.k8s.io", "v1", "leases")
# Leader election must not wait on a hung connection longer than it may go without renewing.
LEASE_REQUEST_TIMEOUT = (3.0, 5.0)
# A scraper waits on a review of its token; Prometheus's own scrape timeout is 10 s by default.
REVIEW_TIMEOUT = (3.0, 5.0)


class Forbidden(Exception):
    """The operator's RBAC does not let it read an object a Stack names; the message says which grant."""


# The core objects the operator handles in a namespace it serves, and only there (rbac/served-namespace.yaml).
_SERVED = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/(?P<resource>secrets|configmaps|serviceaccounts|pods)"
                     r"(?:/[^/]+(?:/(?P<subresource>token))?)?$")


class NamespaceNotServed(ApiException):
    """The operator was refused (403) a Secret, ConfigMap, token or pod in a namespace: it has those rights only
    in the namespaces it serves, and this is not one of them."""

    def __init__(self, err: ApiException, namespace: str, what: str):
        super().__init__(status=err.status, reason=err.reason)
        self.namespace, self.what = namespace, what

    def __str__(self) -> str:
        return (f"the operator may not use {self.what} in namespace {self.namespace!r}: it holds those rights only in "
                "the namespaces it serves (its own, and each team's), never cluster-wide; fix: give the namespace "
                "to a team (strata:teams; its environment grants the operator there), or create in it the "
                "operator's Roles of strata_operator/api/rbac/served-namespace.yaml and bind them to its "
                "ServiceAccount (components.operator.build_served_namespace_rbac renders them)")


def _refused_in_namespace(err: ApiException, path: str) -> ApiException:
    """A 403 on a served-namespace object as NamespaceNotServed; any other error as it is."""
    found = _SERVED.match(path) if err.status == 403 else None
    if found is None:
        return err
    what = "ServiceAccount tokens" if found["subresource"] else found["resource"]
    return NamespaceNotServed(err, found["namespace"], what)


def _absent(err: ApiException) -> bool:
    return err.status == 404


@dataclasses.dataclass
class Kube:
    api: kubernetes.client.ApiClient
    executor: concurrent.futures.Executor | None = None
    """Threads for the calls (default: the loop's shared pool); leader election brings its own so
    that renewals never queue behind Stack work."""

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None) -> "Kube":
        """In-cluster ServiceAccount credentials when running in a pod, otherwise the kubeconfig."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        # The operator's own credentials: masked in every namespace's text and the log (a token the kubelet
        # rotates later is masked only where it shows as an authorization header).
        add_operator_secrets(*(value.split(" ", 1)[-1] for value in configuration.api_key.values()),
                             configuration.password)
        return cls(kubernetes.client.ApiClient(configuration))

    def _core(self, method: str, path: str, body: dict | None = None, timeout: Any = None,
              content_type: str = "application/json") -> dict:
        """One core (v1) API call through the shared client: a JSON body in, the object as a dict out,
        ApiException on any non-2xx answer, as CoreV1Api would. Not CoreV1Api itself: importing it loads
        about 250 generated model modules (21 MB of the operator's RSS) for the few calls made here."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self.api.param_serialize(method=method, resource_path=path, header_params=headers, body=body,
                                           auth_settings=["BearerToken"])
        response = self.api.call_api(*request, _request_timeout=timeout)
        response.read()
        try:
            return self.api.response_deserialize(response, {"2XX": "object"}).data
        except ApiException as err:
            raise _refused_in_namespace(err, path) from None

    def review(self, path: str, body: dict) -> dict:
        """The status of a review (TokenReview, SubjectAccessReview) POSTed to `path`; synchronous, for the
        metrics server's threads."""
        return self._core("POST", path, body, timeout=REVIEW_TIMEOUT).get("status") or {}

    async def _core_get(self, path: str) -> dict | None:
        """A core (v1) object, or None if there is none."""
        try:
            return await self._call(self._core, "GET", path)
        except ApiException as err:
            if _absent(err):
                return None
            raise

    async def _call(self, fn, *args, **kwargs) -> Any:
        try:
            if self.executor is None:
                result = await asyncio.to_thread(fn, *args, **kwargs)
            else:
                result = await asyncio.get_running_loop().run_in_executor(self.executor,
                                                                          functools.partial(fn, *args, **kwargs))
        except ApiException as err:
            api_health.record(err.status)
            raise
        except (urllib3.exceptions.HTTPError, OSError, TimeoutError) as err:  # no answer at all
            api_health.record(None, err)
            raise
        api_health.record(None)
        return result

    async def get_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> dict | None:
        try:
            return await self._call(kubernetes.client.CustomObjectsApi(self.api).get_namespaced_custom_object,
                                    group, version, namespace, plural, name)
        except ApiException as err:
            if _absent(err):
                return None
            raise

    async def get_program(self, namespace: str, name: str) -> dict | None:
        return await self.get_custom(GROUP, VERSION, "programs", namespace, name)

    async def get_stack(self, namespace: str, name: str) -> dict | None:
        return await self.get_custom(GROUP, VERSION, "stacks", namespace, name)

    async def list_stacks(self, namespace: str) -> list[dict]:
        listed = await self._call(kubernetes.client.CustomObjectsApi(self.api).list_namespaced_custom_object,
                                  GROUP, VERSION, namespace, "stacks")
        return listed.get("items", [])

    async def get_flux_source(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        version = api_version.split("/", 1)[1]
        # Any other Flux source kind follows the Kubernetes convention: HelmChart -> helmcharts.
        plural = FLUX_PLURALS.get(kind, kind.lower() + "s")
        try:
            return await self.get_custom(FLUX_GROUP, version, plural, namespace, name)
        except ApiException as err:
            if err.status == 403:
                raise Forbidden(f"the operator may not read {plural}.{FLUX_GROUP}: grant it get on them "
                                "(rbac/clusterrole.yaml)") from None
            raise

    async def patch_stack_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self._patch_status("stacks", namespace, name, status)

    async def patch_program_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self._patch_status("programs", namespace, name, status)

    async def _patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            await self._call(kubernetes.client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status,
                             GROUP, VERSION, namespace, plural, name, {"status": status})
        except ApiException as err:
            if not _absent(err):
                raise

    async def patch_custom_status(self, group: str, version: str, plural: str, namespace: str, name: str,
                                  status: dict[str, Any]) -> bool:
        """Merge-patch the status of any namespaced custom object; False if it is gone."""
        try:
            await self._call(kubernetes.client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status,
                             group, version, namespace, plural, name, {"status": status})
        except ApiException as err:
            if _absent(err):
                return False
            raise
        return True

    async def delete_custom(self, group: str, version: str, plural: str, namespace: str, name: str,
                            uid: str = "") -> bool:
        """Delete a namespaced custom object (only this very one when `uid` is given); False if it is gone."""
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            await self._call(kubernetes.client.CustomObjectsApi(self.api).delete_namespaced_custom_object,
                             group, version, namespace, plural, name, body=body)
        except ApiException as err:
            if _absent(err) or err.status == 409:  # 409: a newer object of the same name
                return False
            raise
        return True

    async def annotate_stack(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        await self._call(kubernetes.client.CustomObjectsApi(self.api).patch_namespaced_custom_object,
                         GROUP, VERSION, namespace, "stacks", name, {"metadata": {"annotations": annotations}})

    async def get_lease(self, namespace: str, name: str) -> dict | None:
        group, version, plural = LEASES
        try:
            return await self._call(kubernetes.client.CustomObjectsApi(self.api).get_namespaced_custom_object,
                                    group, version, namespace, plural, name, _request_timeout=LEASE_REQUEST_TIMEOUT)
        except ApiException as err:
            if _absent(err):
                return None
            raise

    async def create_lease(self, namespace: str, body: dict) -> dict:
        group, version, plural = LEASES
        return await self._call(kubernetes.client.CustomObjectsApi(self.api).create_namespaced_custom_object,
                                group, version, namespace, plural, body, _request_timeout=LEASE_REQUEST_TIMEOUT)

    async def replace_lease(self, namespace: str, name: str, body: dict) -> dict:
        """PUT with the body's resourceVersion: a concurrent writer makes this fail with 409."""
        group, version, plural = LEASES
        return await self._call(kubernetes.client.CustomObjectsApi(self.api).replace_namespaced_custom_object,
                                group, version, namespace, plural, name, body,
                                _request_timeout=LEASE_REQUEST_TIMEOUT)

    async def create_namespace(self, name: str, labels: dict[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels)}}
        await self._call(self._core, "POST", "/api/v1/namespaces", body, LEASE_REQUEST_TIMEOUT)

    async def namespace_annotations(self, name: str) -> dict[str, str]:
        """The namespace's annotations ({} when it is gone)."""
        try:
            namespace = await self._call(self._core, "GET", f"/api/v1/namespaces/{quote(name)}")
        except ApiException as err:
            if _absent(err):
                return {}
            raise
        return dict(((namespace or {}).get("metadata") or {}).get("annotations") or {})

    async def namespace_terminating(self, name: str) -> bool:
        try:
            namespace = await self._call(self._core, "GET", f"/api/v1/namespaces/{quote(name)}")
        except ApiException as err:
            if _absent(err):
                return True
            raise
        return (namespace.get("status") or {}).get("phase") == "Terminating"

    async def secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        data = await self.secret_bytes(namespace, name)
        return None if data is None else {key: value.decode() for key, value in data.items()}

    async def write_secret(self, namespace: str, name: str, data: dict[str, bytes], labels: dict[str, str],
                           owner: dict[str, Any] | None) -> None:
        """Create the Secret, or replace it whole when it exists (it is ours: owned by `owner`, or by nobody
        while its owner is being deleted)."""
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "labels": labels, **({"ownerReferences": [owner]} if owner else {})},
                "data": {key: base64.b64encode(value).decode() for key, value in data.items()}}
        try:
            await self.create_secret(namespace, body)
        except ApiException as err:
            if err.status != 409:
                raise
            await self.replace_secret(namespace, name, body)

    async def secret_bytes(self, namespace: str, name: str) -> dict[str, bytes] | None:
        secret = await self.get_secret(namespace, name)
        return None if secret is None else {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}

    async def get_secret(self, namespace: str, name: str) -> dict | None:
        """The whole Secret as a dict (metadata, type, base64 data), or None if there is none."""
        return await self._core_get(f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(name)}")

    async def create_secret(self, namespace: str, body: dict) -> None:
        await self._call(self._core, "POST", f"/api/v1/namespaces/{quote(namespace)}/secrets", body)

    async def replace_secret(self, namespace: str, name: str, body: dict) -> None:
        """PUT with the body's resourceVersion: a concurrent writer makes this fail with 409."""
        await self._call(self._core, "PUT", f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(name)}", body)

    async def configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        cm = await self._core_get(f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}")
        return None if cm is None else dict(cm.get("data") or {})

    async def service_account_kubeconfig(self, namespace: str, name: str,
                                         seconds: int = 3600) -> tuple[str, str] | None:
        """(kubeconfig YAML, token) for a short-lived TokenRequest token of ServiceAccount `name`; None if
        there is no such ServiceAccount."""
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"audiences": [], "expirationSeconds": seconds}}
        try:
            response = await self._call(
                self._core, "POST", f"/api/v1/namespaces/{quote(namespace)}/serviceaccounts/{quote(name)}/token", request)
        except ApiException as err:
            if _absent(err):
                return None
            raise
        token = response["status"]["token"]
        conf = self.api.configuration
        cluster: dict[str, Any] = {"server": conf.host}
        if conf.ssl_ca_cert:
            with open(conf.ssl_ca_cert, "rb") as ca:
                cluster["certificate-authority-data"] = base64.b64encode(ca.read()).decode()
        elif not conf.verify_ssl:
            cluster["insecure-skip-tls-verify"] = True
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "stack",
            "clusters": [{"name": "cluster", "cluster": cluster}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "stack", "context": {"cluster": "cluster", "user": name, "namespace": namespace}}],
        }
        return yaml.safe_dump(config), token

    # Workspace pods (the pod executor): the pod, its agent Secret and its default ServiceAccount.
    async def get_pod(self, namespace: str, name: str) -> dict | None:
        return await self.get_core(namespace, "pods", name)

    async def create_pod(self, namespace: str, body: dict) -> dict:
        return await self._call(self._core, "POST", f"/api/v1/namespaces/{quote(namespace)}/pods", body)

    async def delete_pod(self, namespace: str, name: str) -> None:
        await self.delete_core(namespace, "pods", name)

    async def get_core(self, namespace: str, resource: str, name: str) -> dict | None:
        """A namespaced core object (`resource`: pods, secrets, serviceaccounts...), or None."""
        return await self._core_get(f"/api/v1/namespaces/{quote(namespace)}/{resource}/{quote(name)}")

    async def delete_core(self, namespace: str, resource: str, name: str) -> None:
        """Delete it; one that is gone already is fine."""
        try:
            await self._call(self._core, "DELETE", f"/api/v1/namespaces/{quote(namespace)}/{resource}/{quote(name)}")
        except ApiException as err:
            if not _absent(err):
                raise

    async def disown(self, namespace: str, resource: str, name: str) -> dict | None:
        """Drop the object's ownerReferences (the garbage collector leaves it alone then): the object as
        it is now, or None if there is none."""
        try:
            return await self._call(self._core, "PATCH", f"/api/v1/namespaces/{quote(namespace)}/{resource}/{quote(name)}",
                                    {"metadata": {"ownerReferences": None}}, content_type="application/merge-patch+json")
        except ApiException as err:
            if _absent(err):
                return None
            raise

    async def create_service_account(self, namespace: str, body: dict) -> None:
        """Create it unless it exists (what exists is left as it is)."""
        try:
            await self._call(self._core, "POST", f"/api/v1/namespaces/{quote(namespace)}/serviceaccounts", body)
        except ApiException as err:
            if err.status != 409:
                raise
