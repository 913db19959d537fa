"""`make up STACK=cluster` / `strata dev up --stack cluster`: the bootstrap's cluster stack on the stand-in.

`Pulumi.cluster.yaml` is what a GKE, EKS or own-cluster user copies: the cluster by kubeconfig and
context, Flux in-cluster from a registry, the operator as a Deployment with the pod executor, every
layer's state in an object store. Here the cluster profile of the local platform plays that cluster
(real nodes, a registry, MinIO, a git server), in the home's `platform-cluster/`. This module starts
it, pushes the operator image, fills this machine's addresses into the home's copy of the stack
config (the committed file stays as committed), checks that copy's registry, images, bucket,
credentials and context in seconds, and then runs it exactly as `make up` runs the dev stack
(devstack.prepare, up_and_wait, down): same progress, same summary.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from .. import s3
from ..s3 import BACKEND_CREDENTIAL_KEYS
from strata_operator.decisions.lease import DEFAULT_LEASE_NAME

from . import objectstore, realnode, registry, stackwatch
from .devstack import DEFAULT_UP_TIMEOUT, DevHome, DevStackError, down as stack_down, dev_home, prepare, project_name, \
    up_and_wait
from .fluxbundle import ensure_bundle
from .gitserver import GitRepos
from .operator_host import OPERATOR_NAMESPACE
from .platform import LocalPlatform, PlatformConfig, PlatformError
from .preflight import missing_dev_stack_requirements
from .progress import Say, stderr_say

STACK = "cluster"
CONTEXT = "strata-cluster"
"""The kubeconfig context the stand-in's kubeconfig names (Pulumi.cluster.yaml's `context`)."""
OPERATOR_REPOSITORY = "strata-operator"
PROJECT_REPOSITORY = "strata"
OPERATOR_PODS = "app.kubernetes.io/name=strata-operator"
FLUX_PREFIX = "fluxcd"
SERVICE_SERVER = f"https://{realnode.SERVICE_ADDRESS}:443"
"""The apiserver as the `kubernetes` Service: the same address from the host and from every pod, its
certificate names it (the platform's loopback address would be the pod itself)."""


@dataclasses.dataclass(frozen=True)
class Machine:
    """This machine's values for the placeholders of the committed Pulumi.cluster.yaml."""

    kubeconfig: str
    context: str
    registry: str
    """host:port of the registry."""
    flux_bundle_url: str
    backend: str
    repo: str
    operator_image: str


def fill_cluster_config(config: dict[str, Any], machine: Machine) -> dict[str, Any]:
    """The cluster stack's config with this machine's kubeconfig, registry, Flux bundle, object store,
    published repository and operator image in place of the committed placeholders."""
    config = json.loads(json.dumps(config))  # a deep copy of plain YAML data
    cluster = config.setdefault("strata:cluster", {})
    cluster["existing"] = {**(cluster.get("existing") or {}), "kubeconfigPath": machine.kubeconfig,
                           "context": machine.context}
    flux = config.setdefault("strata:flux", {})
    flux["registry"] = f"{machine.registry}/{FLUX_PREFIX}"
    # The stand-in has no route to GitHub's releases: the install bundle comes from the platform.
    flux["baseurl"] = machine.flux_bundle_url
    config.setdefault("strata:operator", {})["image"] = machine.operator_image
    platform = config.setdefault("strata:platform", {})
    platform.update(backend=machine.backend, repo=machine.repo)
    return config


def service_kubeconfig(admin: str, context: str = CONTEXT, server: str = SERVICE_SERVER) -> str:
    """The platform's admin kubeconfig with one context, `context`, and the apiserver at `server`."""
    document = yaml.safe_load(admin)
    (cluster,), (user,) = document["clusters"], document["users"]
    cluster = {"name": context, "cluster": {**cluster["cluster"], "server": server}}
    user = {**user, "name": context}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "users": [user],
                           "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
                           "current-context": context}, sort_keys=False)


# -- checks: bad input named with its field and the fix, in seconds ------------------------------------
# Each is pure: it takes what was observed (an HTTP status, or the error text when nothing answered) and
# returns the one-line problem, or None.

def context_problem(field: str, path: str, kubeconfig: str | None, context: str | None) -> str | None:
    """`kubeconfig` is the file's text (None when it cannot be read)."""
    if kubeconfig is None:
        return f"{field}: the kubeconfig {path} does not exist or cannot be read; fix: point kubeconfigPath at your " \
               "cluster's kubeconfig (gcloud container clusters get-credentials / aws eks update-kubeconfig write one)"
    if context is None:
        return None
    contexts = [entry.get("name") for entry in (yaml.safe_load(kubeconfig) or {}).get("contexts") or []]
    if context in contexts:
        return None
    return f"{field}: context {context!r} is not in {path} (it has: {', '.join(map(str, contexts)) or 'none'}); " \
           "fix: name one of those (kubectl config get-contexts), or remove `context` to use its current-context"


def registry_problem(field: str, host: str, answer: int | str) -> str | None:
    """`answer`: the status of GET /v2/ (200, or 401 from a registry asking for credentials, both answer)."""
    if answer in (200, 401):
        return None
    why = f"answered HTTP {answer} to /v2/" if isinstance(answer, int) else answer
    return f"{field}: the registry {host} cannot be reached ({why}); fix: start it, or name a registry this " \
           "machine and the cluster's nodes reach"


def image_problem(field: str, reference: str, found: bool) -> str | None:
    if found:
        return None
    return f"{field}: the image {reference} is not in its registry; fix: push it (`strata image build --push` " \
           "for the operator; Flux's with `flux install --registry` conventions), or name one that is there"


def bucket_problem(field: str, backend: str, answer: int | str, credentials: str) -> str | None:
    """`answer`: the status of HEAD on the bucket with `credentials` (where they came from, never their values)."""
    bucket = urlsplit(backend).netloc
    if answer == 200:
        return None
    if answer == 404:
        return f"{field}: bucket {bucket!r} does not exist in {backend_endpoint(backend)}; fix: create it " \
               f"(strata local bucket {bucket}, aws s3 mb s3://{bucket}), or name one that does"
    if answer == 403:
        return f"{field}: the object store {backend_endpoint(backend)} refused the credentials from {credentials} " \
               f"for bucket {bucket!r}; fix: give that store's access key and secret"
    why = f"answered HTTP {answer}" if isinstance(answer, int) else answer
    return f"{field}: the object store of {backend} cannot be reached ({why}); fix: start it, or correct the " \
           "URL's endpoint"


def backend_endpoint(backend: str) -> str:
    """The endpoint of an s3:// backend URL (`endpoint=`), else AWS's."""
    return s3.backend_endpoint(backend) or "https://s3.amazonaws.com"


def flux_images(bundle: Path, version: str, components: Iterable[str], registry_path: str) -> list[str]:
    """The controller images an air-gapped install of `components` pulls: the install bundle's own, from
    `registry_path` as `flux install --registry` names them."""
    wanted = set(components)
    images = []
    with tarfile.open(bundle / "download" / version / "manifests.tar.gz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or Path(member.name).stem not in wanted:
                continue
            for document in yaml.safe_load_all(tar.extractfile(member).read()):
                if (document or {}).get("kind") == "Deployment":
                    for container in document["spec"]["template"]["spec"]["containers"]:
                        images.append(f"{registry_path}/{container['image'].rsplit('/', 1)[-1]}")
    return sorted(images)


def in_cluster_operator_blocker(pods: list[dict[str, Any]], holder: str, lease: str) -> str:
    """Why the in-cluster operator handles no Stacks now, from its pods and its leader Lease's holder ("" when a
    Ready pod of it holds the Lease)."""
    if not pods:
        return "no operator pod exists yet"
    ready, waiting = [], []
    for pod in pods:
        name, status = pod["metadata"]["name"], pod.get("status") or {}
        if any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []):
            ready.append(name)
            continue
        states = [c.get("state", {}).get("waiting") or {} for c in status.get("containerStatuses") or []]
        why = "; ".join(f"{s.get('reason', '')}: {s.get('message', '')}".strip(": ") for s in states if s)
        waiting.append(f"{name} {status.get('phase', 'Pending')}" + (f" ({why})" if why else ""))
    if not ready:
        return "no operator pod is Ready: " + ", ".join(waiting)
    if holder.split("_", 1)[0] in ready:
        return ""
    return f"the operator's pods ({', '.join(ready)}) have not taken the Lease {lease} yet"


# -- the observations behind the checks ------------------------------------------------------------

def _registry_answer(host: str) -> int | str:
    connection = http.client.HTTPConnection(host, timeout=5)
    try:
        connection.request("GET", "/v2/")
        return connection.getresponse().status
    except OSError as error:
        return str(error) or type(error).__name__
    finally:
        connection.close()


def _bucket_answer(backend: str, credentials: tuple[str, str]) -> int | str:
    try:
        return objectstore.head_bucket(backend_endpoint(backend), urlsplit(backend).netloc, credentials)
    except objectstore.ObjectStoreError as error:
        return str(error)


def check_stack_config(config: Mapping[str, Any], credentials: tuple[str, str], credentials_source: str,
                       flux_bundle: Path | None) -> list[str]:
    """Every problem of the filled cluster stack config that would otherwise show as a timeout."""
    problems = []
    existing = (config.get("strata:cluster") or {}).get("existing") or {}
    if "kubeconfigPath" in existing:
        path = os.path.expanduser(existing["kubeconfigPath"])
        text = Path(path).read_text() if os.path.isfile(path) else None
        problems.append(context_problem("strata:cluster.existing.context" if text else
                                        "strata:cluster.existing.kubeconfigPath", path, text, existing.get("context")))
    flux = config.get("strata:flux") or {}
    operator = config.get("strata:operator") or {}
    images: list[tuple[str, str]] = []
    if "registry" in flux:
        host = flux["registry"].split("/", 1)[0]
        problem = registry_problem("strata:flux.registry", host, _registry_answer(host))
        problems.append(problem)
        if problem is None and flux_bundle is not None:
            images += [("strata:flux.registry", image) for image in flux_images(
                flux_bundle, flux.get("version", ""), flux.get("components", ()), flux["registry"])]
    if operator.get("image"):
        host = operator["image"].split("/", 1)[0]
        problem = registry_problem("strata:operator.image", host, _registry_answer(host))
        problems.append(problem)
        if problem is None:
            images.append(("strata:operator.image", operator["image"]))
    for field, image in images:
        problems.append(image_problem(field, image, registry.manifest_exists(image)))
    backend = (config.get("strata:platform") or {}).get("backend", "")
    if backend.startswith("s3://"):
        problems.append(bucket_problem("strata:platform.backend", backend, _bucket_answer(backend, credentials),
                                       credentials_source))
    return [problem for problem in problems if problem]


# -- up and down ---------------------------------------------------------------------------------

def _operator_blocker(reader: stackwatch.StackReader) -> Callable[[], str]:
    lease = f"{OPERATOR_NAMESPACE}/{DEFAULT_LEASE_NAME}"

    def blocker() -> str:
        holder = (reader.lease(OPERATOR_NAMESPACE, DEFAULT_LEASE_NAME) or {}).get("holderIdentity") or ""
        return in_cluster_operator_blocker(reader.pods(OPERATOR_NAMESPACE, OPERATOR_PODS), holder, lease)

    return blocker


def stand_in(home: DevHome) -> LocalPlatform:
    """The cluster profile in the home: real nodes, a registry, an object store; no Flux on the host
    (the cluster stack installs it in-cluster)."""
    return LocalPlatform(PlatformConfig(state_dir=home.platform_dir, profile="cluster", host_controllers=()))


def backend_credentials(platform: LocalPlatform) -> tuple[tuple[str, str], str]:
    """The object store's access key and secret, and where they came from: the environment when it
    has them (a user's own store), else the stand-in's credentials file."""
    if all(os.environ.get(key) for key in BACKEND_CREDENTIAL_KEYS):
        return (os.environ[BACKEND_CREDENTIAL_KEYS[0]], os.environ[BACKEND_CREDENTIAL_KEYS[1]]), \
            f"${BACKEND_CREDENTIAL_KEYS[0]}/${BACKEND_CREDENTIAL_KEYS[1]}"
    path = platform.object_store_credentials
    return objectstore.read_credentials(path), str(path)


def _start(project: Path, base: Path, say: Say) -> tuple[DevHome, LocalPlatform, dict[str, str],
                                                         Callable[[dict[str, Any]], dict[str, Any]], bool]:
    """The stand-in up, the operator image pushed, the project published; what the stack's runs need."""
    home = DevHome(base, stack=STACK)
    platform = stand_in(home)
    say(f"==> the stand-in for your cluster (the cluster profile) in {home.platform_dir}")
    try:
        info = platform.up(say=say)
    except PlatformError as error:
        raise DevStackError(str(error)) from None
    home = DevHome(base, stack=STACK, backend=platform.s3_backend_url())
    credentials, _source = backend_credentials(platform)
    env = dict(zip(BACKEND_CREDENTIAL_KEYS, credentials))
    kubeconfig = platform.state / "kubeconfigs" / f"{CONTEXT}.kubeconfig"
    kubeconfig.write_text(service_kubeconfig(info.kubeconfig))
    kubeconfig.chmod(0o600)
    # Here, not at the top: the component module imports the Pulumi SDK (0.3 s), which every other
    # `strata` command (`make up` runs three) would pay for at each start.
    from ..project_repo import DEFAULT_INCLUDE, collect_files, publish
    git = GitRepos(info.git.root, f"http://{realnode.NODE_ADDRESS}:{info.ports['git']}", info.git.push_credentials)
    publish(git, PROJECT_REPOSITORY, collect_files(project, DEFAULT_INCLUDE))
    machine = Machine(kubeconfig=str(kubeconfig), context=CONTEXT, registry=platform.registry_host(),
                      flux_bundle_url=info.flux_bundle_url, backend=home.backend_url,
                      repo=git.url(PROJECT_REPOSITORY), operator_image=_push_operator_image(platform, say))
    exists = objectstore.object_exists(platform.object_store_port(), objectstore.DEFAULT_BUCKET,
                                       f".pulumi/stacks/{project_name(project)}/{STACK}.json", credentials)
    return home, platform, env, lambda config: fill_cluster_config(config, machine), exists


def _push_operator_image(platform: LocalPlatform, say: Say) -> str:
    from .images import ImageError, build_operator_image, build_missing_install_message, user_pulumi_install

    install = user_pulumi_install()
    if install.missing:
        raise DevStackError(build_missing_install_message(install.missing))
    try:
        image = build_operator_image(platform.toolchain, install, say=say)
        reference = platform.push_image(image, OPERATOR_REPOSITORY, image.name.rsplit(":", 1)[1])
    except (ImageError, PlatformError) as error:
        raise DevStackError(str(error)) from None
    say(f"  operator image: {reference}")
    return reference


def up(project: Path, base: Path | None = None, timeout: float = DEFAULT_UP_TIMEOUT, say: Say = stderr_say) -> None:
    missing = missing_dev_stack_requirements()
    if missing:
        raise DevStackError(f"the {STACK} stack needs: " + "; ".join(missing))
    started = time.monotonic()
    home, platform, env, fill, exists = _start(project, base or dev_home().base, say)
    run, stack_config = prepare(project, home, env=env, exists=exists, fill=fill)
    credentials, source = backend_credentials(platform)
    say(f"==> checking the {STACK} stack's registry, images, bucket and kubeconfig")
    bundle = ensure_bundle(platform.toolchain, say)
    problems = check_stack_config(stack_config.get("config") or {}, credentials, source, bundle)
    if problems:
        raise DevStackError(f"{home.stack_config} (from Pulumi.{STACK}.yaml):\n  " + "\n  ".join(problems))
    up_and_wait(run, project, home, stack_config, platform.kubeconfig_path, timeout, started, say,
                blocker=_operator_blocker)


def down(project: Path, base: Path | None = None, force: bool = False, stuck_after: float | None = None,
         say: Say = stderr_say) -> None:
    """Destroy the cluster stack (the stand-in started again first: its operator destroys the Stacks),
    then stop the stand-in and remove its state."""
    base = base or dev_home().base
    if not DevHome(base, stack=STACK).platform_dir.exists():  # its state, the bootstrap's included, went with it
        say(f"==> no stand-in in {DevHome(base, stack=STACK).platform_dir}: nothing of the {STACK} stack to destroy")
        return
    home, platform, env, fill, exists = _start(project, base, say)
    extra = {} if stuck_after is None else {"stuck_after": stuck_after}
    stack_down(project, home, force=force, say=say, env=env, exists=exists, fill=fill, platform=platform, **extra)


