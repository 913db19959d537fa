"""Strata's components as a Pulumi component package, for programs in any Pulumi language.

`package/` is the plugin (`PulumiPlugin.yaml`, runtime python): `pulumi package add <repo>/package`
infers the schema from the components' `XArgs(TypedDict)` and typed outputs and generates an SDK.
`Stack` and `Program` are Kubernetes custom resources in Python; a package can only serve
components, so here each is a component holding that custom resource, with the provider as an arg.
The components' modules keep real annotations (no `from __future__ import annotations`): the
inference reads them at runtime (tests/unit/components/test_package.py fails otherwise).
"""

from importlib.metadata import version

import pulumi
import pulumi_kubernetes as k8s

from . import stack
from .cluster import Cluster
from .flux import Flux
from .operator import Operator
from .team import TeamEnvironment

PACKAGE_NAME = "strata"


class StackComponentArgs(stack.StackArgs):
    provider: k8s.Provider
    """Provider of the cluster the operator watches."""


class ProgramComponentArgs(stack.ProgramArgs):
    provider: k8s.Provider
    """Provider of the cluster the operator watches."""


class Stack(pulumi.ComponentResource):
    """A pulumi.com/v1 Stack: the operator runs `spec.stack` from its source until it is Ready."""

    name: pulumi.Output[str]
    """Name of the Stack object."""
    namespace: pulumi.Output[str]
    """Namespace of the Stack object."""

    def __init__(self, name: str, args: StackComponentArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{PACKAGE_NAME}:index:Stack", name, {}, opts)
        stack_args = {key: value for key, value in args.items() if key != "provider"}
        created = stack.Stack(name, stack_args, pulumi.ResourceOptions(parent=self, provider=args["provider"]))
        self.name = created.metadata.apply(lambda metadata: metadata["name"])
        self.namespace = created.metadata.apply(lambda metadata: metadata["namespace"])
        self.register_outputs({"name": self.name, "namespace": self.namespace})


class Program(pulumi.ComponentResource):
    """A pulumi.com/v1 Program: a Pulumi YAML program stored in the cluster, for Stacks' `program_ref`."""

    name: pulumi.Output[str]
    """Name of the Program object (what a Stack's `program_ref` names)."""
    namespace: pulumi.Output[str]
    """Namespace of the Program object."""

    def __init__(self, name: str, args: ProgramComponentArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{PACKAGE_NAME}:index:Program", name, {}, opts)
        program_args = {key: value for key, value in args.items() if key != "provider"}
        created = stack.Program(name, program_args, pulumi.ResourceOptions(parent=self, provider=args["provider"]))
        self.name = created.metadata.apply(lambda metadata: metadata["name"])
        self.namespace = created.metadata.apply(lambda metadata: metadata["namespace"])
        self.register_outputs({"name": self.name, "namespace": self.namespace})


COMPONENTS = [Cluster, Flux, Operator, Stack, Program, TeamEnvironment]


def serve() -> None:
    """Run as the package's provider plugin (the language host starts `package/__main__.py`)."""
    from pulumi.provider.experimental import component_provider_host

    component_provider_host(COMPONENTS, name=PACKAGE_NAME, version=version("strata"))
