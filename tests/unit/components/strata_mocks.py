"""Pulumi mocks that also record how each resource was registered (parent, dependencies, provider).

The SDK's MockMonitor keeps only a resource's state; the graph assertions here need the rest of the
RegisterResource request, so the monitor below records it before delegating.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import runpy
from pathlib import Path
from typing import Any, Callable

import pulumi
import yaml
from pulumi.runtime import mocks, rpc

FIXTURES = Path(__file__).parent / "fixtures"
FLUX_INSTALL = (FIXTURES / "flux-install.yaml").read_text()
FAKE_CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIfake\n-----END CERTIFICATE-----\n").decode()


# What the local platform's dynamic provider reports for the servers on the ports it picked.
FLUX_BUNDLE_URL = "http://127.0.0.1:41001"
GIT_URL = "http://127.0.0.1:41002"


def published_commit(digest: str) -> str:
    """The commit a mocked ProjectRepo reports: one per content digest."""
    return digest[:40]


def fake_token(namespace: str, name: str) -> str:
    return f"token-of-{namespace}-{name}"


def admin_kubeconfig(server: str = "https://127.0.0.1:6443") -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "admin",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": FAKE_CA}}],
        "contexts": [{"name": "admin", "context": {"cluster": "local", "user": "admin"}}],
        "users": [{"name": "admin", "user": {"token": "admin-secret-token"}}],
    })


@dataclasses.dataclass
class Registration:
    type: str
    name: str
    urn: str
    parent: str
    dependencies: list[str]
    provider: str
    custom: bool
    remote: bool
    additional_secret_outputs: list[str]
    inputs: dict[str, Any]


class RecordingMonitor(mocks.MockMonitor):
    def __init__(self, mocks_: mocks.Mocks):
        super().__init__(mocks_)
        self.registrations: list[Registration] = []

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.registrations.append(Registration(
                type=request.type, name=request.name, urn=response.urn, parent=request.parent,
                dependencies=list(request.dependencies), provider=request.provider, custom=request.custom,
                remote=request.remote, additional_secret_outputs=list(request.additionalSecretOutputs),
                inputs=rpc.deserialize_properties(request.object)))
        return response


    def ReadResource(self, request):
        # StackReferences are reads of an existing resource, not registrations.
        response = super().ReadResource(request)
        self.registrations.append(Registration(
            type=request.type, name=request.name, urn=response.urn, parent=request.parent,
            dependencies=list(request.dependencies), provider=request.provider, custom=True, remote=False,
            additional_secret_outputs=list(request.additionalSecretOutputs),
            inputs=rpc.deserialize_properties(request.properties)))
        return response


def secret_value(value: Any) -> Any:
    """The plain value of an input that went over the wire as a secret; fails if it was not secret."""
    assert isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig, \
        f"expected a secret, got {value!r}"
    return value["value"]


class StrataMocks(mocks.Mocks):
    """Outputs the real providers would compute, for the fields the components read back."""

    def __init__(self, stack_outputs: dict[str, dict[str, Any]] | None = None,
                 secret_outputs: dict[str, list[str]] | None = None):
        self.stack_outputs = stack_outputs or {}
        self.secret_outputs = secret_outputs or {}
        self.calls: list[mocks.MockCallArgs] = []

    def new_resource(self, args: mocks.MockResourceArgs):
        state = dict(args.inputs)
        if args.typ.startswith(("gcp:", "aws:")):
            state.setdefault("name", args.name)  # cloud providers compute names the program reads back
        if args.typ == "kubernetes:core/v1:Secret" and state.get("type") == "kubernetes.io/service-account-token":
            meta = state["metadata"]
            account = meta["annotations"]["kubernetes.io/service-account.name"]
            state["data"] = {"token": base64.b64encode(fake_token(meta["namespace"], account).encode()).decode(),
                             "ca.crt": FAKE_CA}
        elif args.typ == "pulumi-python:dynamic:Resource" and "host_controllers" in state:
            state.update(kubeconfig=admin_kubeconfig(), server="https://127.0.0.1:6443",
                         kubeconfig_path=f"{state['state_dir']}/kubeconfig", flux_bundle_url=FLUX_BUNDLE_URL,
                         git_url=GIT_URL)
        elif args.typ == "pulumi-python:dynamic:Resource" and "digest" in state:
            state.update(url=f"{state['git_url']}/{state['name']}.git", commit=published_commit(state["digest"]))
        elif args.typ == "pulumi-python:dynamic:Resource" and "lifetime_seconds" in state:
            # What STS AssumeRole would mint: fake credentials, named after the bucket they are for.
            state.update(access_key_id=f"fake-key-{state['bucket']}", secret_access_key=f"fake-secret-{state['bucket']}",
                         session_token=f"fake-token-{state['bucket']}", issued="2026-01-01T00:00:00+00:00",
                         expiration="2026-01-31T00:00:00+00:00")
        elif args.typ == "gcp:container/cluster:Cluster":
            state.update(endpoint="34.1.2.3", masterAuth={"clusterCaCertificate": FAKE_CA,
                                                          "clientCertificateConfig": {"issueClientCertificate": False}})
        elif args.typ == "aws:eks/cluster:Cluster":
            state.update(endpoint="https://ABC.gr7.eu-west-1.eks.amazonaws.com", certificateAuthority={"data": FAKE_CA},
                         name=state.get("name") or args.name)
        elif args.typ == "aws:iam/role:Role":
            state.update(arn=f"arn:aws:iam::123456789012:role/{args.name}", name=args.name)
        elif args.typ == "pulumi:pulumi:StackReference":
            state["outputs"] = self.stack_outputs[state["name"]]
            state["secretOutputNames"] = self.secret_outputs.get(state["name"], [])
        return f"{args.name}-id", state

    def call(self, args: mocks.MockCallArgs):
        self.calls.append(args)
        if args.token == "flux:index/getFluxInstall:getFluxInstall":
            return {**args.args, "content": FLUX_INSTALL, "id": "flux", "path": "strata/flux-system/gotk-components.yaml"}
        if args.token == "flux:index/getFluxSync:getFluxSync":
            content = yaml.safe_dump_all([
                {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
                 "metadata": {"name": args.args["name"], "namespace": args.args["namespace"]},
                 # As the provider renders it: a Secret named after the sync, whether or not one was given.
                 "spec": {"url": args.args["url"], "ref": {"branch": args.args["branch"]}, "interval": "1m0s",
                          "secretRef": {"name": args.args.get("secret") or "flux-system"}}},
                {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                 "metadata": {"name": args.args["name"], "namespace": args.args["namespace"]},
                 "spec": {"path": args.args["targetPath"], "prune": True, "interval": "10m0s",
                          "sourceRef": {"kind": "GitRepository", "name": args.args["name"]}}}])
            return {**args.args, "content": content, "id": "sync", "kustomizeContent": "", "kustomizePath": "",
                    "path": "", "patchFilePaths": {}}
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"names": ["eu-west-1a", "eu-west-1b", "eu-west-1c"], "zoneIds": ["a", "b", "c"], "id": "eu-west-1",
                    "groupNames": [], "groupName": ""}
        raise AssertionError(f"unexpected invoke {args.token}")


@dataclasses.dataclass
class Resolved:
    value: Any
    secret: bool
    known: bool


class Harness:
    def __init__(self, stack_outputs: dict[str, dict[str, Any]] | None = None, project: str = "strata",
                 stack: str = "dev", config: dict[str, Any] | None = None,
                 secret_outputs: dict[str, list[str]] | None = None):
        self.mocks = StrataMocks(stack_outputs, secret_outputs)
        self.monitor = RecordingMonitor(self.mocks)
        pulumi.runtime.set_mocks(self.mocks, project=project, stack=stack, preview=False, monitor=self.monitor)
        # Config as the engine hands it to a program: "<project>:<key>" -> string (objects as JSON).
        pulumi.runtime.set_all_config({f"{project}:{key}" if ":" not in key else key:
                                       value if isinstance(value, str) else json.dumps(value)
                                       for key, value in (config or {}).items()}, [])

    def run(self, build: Callable[[], dict[str, pulumi.Output]]) -> dict[str, Resolved]:
        """Run `build` as a Pulumi program; returns each named output's value and secretness."""
        results: dict[str, Resolved] = {}

        async def inspect(name: str, output: Any) -> None:
            output = pulumi.Output.from_input(output)
            results[name] = Resolved(await output.future(), await output.is_secret(), await output.is_known())

        @pulumi.runtime.test
        def program():
            outputs = build() or {}
            return pulumi.Output.from_input(asyncio.gather(*(inspect(k, v) for k, v in outputs.items())))

        program()
        return results

    def run_program(self, path: Path) -> dict[str, Resolved]:
        """Run a Pulumi program file (its __main__.py) under these mocks; returns its stack exports."""
        exports: dict[str, Any] = {}
        original = pulumi.export

        def capture(name: str, value: Any) -> None:
            exports[name] = value
            original(name, value)

        pulumi.export = capture
        try:
            return self.run(lambda: (runpy.run_path(str(path), run_name="__main__"), exports)[1])
        finally:
            pulumi.export = original

    # -- queries ---------------------------------------------------------------------------------
    @property
    def registrations(self) -> list[Registration]:
        return self.monitor.registrations

    def one(self, type_: str, name: str | None = None) -> Registration:
        found = [r for r in self.registrations if r.type == type_ and (name is None or r.name == name)]
        assert len(found) == 1, f"expected one {type_} {name or ''}, found {[r.name for r in found]}"
        return found[0]

    def all(self, type_: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_]

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.registrations if r.urn == urn)

    def children(self, parent: Registration) -> list[Registration]:
        return [r for r in self.registrations if r.parent == parent.urn]

    @staticmethod
    def provider_urn(reference: str) -> str:
        """A provider reference is `<urn>::<id>`."""
        return reference.rsplit("::", 1)[0]
