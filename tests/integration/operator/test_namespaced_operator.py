"""An operator that watches named namespaces (`--namespace`, as a team's own install runs it) finalizes the
Stacks of a namespace being deleted, so the namespace goes. Before, Kopf dropped the namespace from its
watch as soon as it read it terminating (the first conditions a Terminating namespace gets all read
False), never saw its Stacks' deletion, and their finalizers kept the namespace Terminating for good."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from strata_components.local import processes
from strata_components.local.operator_host import operator_host
from strata_operator.api import FINALIZER

from .conftest import MIN_RESYNC_SECONDS, Operator, stash_program, unique


@pytest.fixture
def namespaced(operator: Operator, platform, toolchain, plugin_cache, namespace: str,
               tmp_path: Path) -> Iterator[Operator]:
    """The session's operator (which watches every namespace) stopped; in its place one that watches only
    the test's namespace. The session's operator comes back afterwards."""
    operator.stop()
    host = operator_host(platform, toolchain, tmp_path / "namespaced", name="strata-operator-namespaced",
                         extra_args=("--min-resync-seconds", str(MIN_RESYNC_SECONDS), "--plugin-cache",
                                     str(plugin_cache), "--namespace", namespace))
    watching = Operator(**{name: getattr(host, name) for name in host.__dataclass_fields__})
    try:
        watching.start()
        yield watching
    finally:
        watching.stop()
        operator.start()


def test_a_namespace_deleted_under_an_operator_watching_only_it_goes_with_its_stacks(namespaced, stacks):
    stacks.program("stash", stash_program(value="held"))
    name = unique("held")
    stacks.create(name, stacks.spec(programRef={"name": "stash"}))
    assert FINALIZER in stacks.wait_ready(name, timeout=120)["metadata"]["finalizers"]

    core = stacks.core
    # A workload beside the Stacks, as in any team's namespace: the namespace controller's first pass then
    # waits out the pod's grace period and writes the first Terminating conditions, all False.
    core.create_namespaced_pod(stacks.namespace, {"metadata": {"name": "workload"}, "spec": {
        "containers": [{"name": "main", "image": "registry.invalid/workload:1"}]}})
    core.delete_namespace(stacks.namespace)

    def gone() -> bool:
        try:
            core.read_namespace(stacks.namespace)
        except client.ApiException as error:
            return error.status == 404
        return False

    try:
        processes.wait_until(gone, 60, f"namespace {stacks.namespace} gone", interval=0.5)
    except processes.ProcessError:
        left = stacks.custom.list_namespaced_custom_object("pulumi.com", "v1", stacks.namespace, "stacks")["items"]
        raise AssertionError(f"Stacks left, with their finalizers: "
                             f"{[(s['metadata']['name'], s['metadata'].get('finalizers')) for s in left]}; "
                             f"the operator's log ends:\n{namespaced.log_text()[-3000:]}") from None
