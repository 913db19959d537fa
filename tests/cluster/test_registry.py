"""The registry: an image pushed from the host is pulled by a pod on each node (no import, no `Never`),
CoreDNS came from it too, and an image missing from it is named in the pod's events."""

from __future__ import annotations

from kubernetes import client

from strata_components.local import cluster_addons, processes, registry

from .conftest import on_node, wait_phase


def test_an_image_pushed_to_the_registry_is_pulled_by_a_pod_on_each_node(platform, kube_client, namespace, nodes,
                                                                          python_image):
    core = client.CoreV1Api(kube_client)
    host, repository, _ = registry.split_reference(python_image)
    assert host == platform.registry_host() and registry.manifest_exists(python_image)
    for node in nodes:
        name = f"pulled-{node.name}"
        core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": on_node(
            node.name, restartPolicy="Never", containers=[{
                "name": "main", "image": python_image, "imagePullPolicy": "Always",
                "command": ["python3", "-c", "print('ran from the registry')"]}])})
        pod = wait_phase(core, namespace, name, {"Succeeded", "Failed"}, timeout=300)
        assert pod.status.phase == "Succeeded", pod.status.container_statuses
        assert core.read_namespaced_pod_log(name, namespace).strip() == "ran from the registry"
        (status,) = pod.status.container_statuses
        assert status.image_id.startswith(f"{host}/{repository}@sha256:"), status.image_id
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        assert any(e.reason == "Pulled" for e in events), [(e.reason, e.message) for e in events]


def test_coredns_runs_from_the_registry(platform, kube_client):
    pods = client.CoreV1Api(kube_client).list_namespaced_pod(
        cluster_addons.DNS_NAMESPACE, label_selector="k8s-app=kube-dns").items
    assert pods
    for pod in pods:
        (status,) = pod.status.container_statuses
        assert pod.spec.containers[0].image.startswith(f"{platform.registry_host()}/coredns/coredns:v1.15.0")
        assert status.image_id.startswith(f"{platform.registry_host()}/coredns/coredns@sha256:"), status.image_id


def test_an_image_missing_from_the_registry_is_named_in_the_pods_events(platform, kube_client, namespace, nodes):
    core = client.CoreV1Api(kube_client)
    missing = f"{platform.registry_host()}/strata-operator:never-pushed"
    core.create_namespaced_pod(namespace, {"metadata": {"name": "missing"}, "spec": on_node(
        nodes[0].name, containers=[{"name": "main", "image": missing}])})

    def failed_pull():
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=missing").items
        return [e.message for e in events if e.reason == "Failed" and missing in e.message]

    messages = processes.wait_until(failed_pull, 120, "a Failed event naming the missing image")
    assert any("not found" in message for message in messages), messages

    def waiting_reason():
        (status,) = core.read_namespaced_pod("missing", namespace).status.container_statuses or [None]
        reason = status.state.waiting.reason if status and status.state.waiting else None
        return reason if reason in ("ErrImagePull", "ImagePullBackOff") else None

    # The kubelet records the event before the container's status says why it waits.
    processes.wait_until(waiting_reason, 30, "the container waiting on its image pull")


def test_fluxs_controller_images_are_in_the_registry_where_an_air_gapped_install_expects_them(
        platform, kube_client, namespace, nodes):
    from strata_components.local.platform import HOST_CONTROLLERS
    from strata_components.local.toolchain import load_specs

    specs = load_specs()
    references = {c: f"{platform.flux_registry()}/{c}:{specs[c].version}" for c in HOST_CONTROLLERS}
    assert platform.flux_registry() == f"{platform.registry_host()}/fluxcd"
    assert all(registry.manifest_exists(reference) for reference in references.values()), references
    # Static binary, non-root: runs with runAsNonRoot and nothing but what the image holds.
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_pod(namespace, {"metadata": {"name": "source-controller"}, "spec": on_node(
        nodes[-1].name, restartPolicy="Never",
        securityContext={"runAsNonRoot": True},
        containers=[{"name": "manager", "image": references["source-controller"], "args": ["--help"]}])})
    pod = wait_phase(core, namespace, "source-controller", {"Succeeded", "Failed"}, timeout=180)
    log = core.read_namespaced_pod_log("source-controller", namespace)
    assert pod.status.phase == "Succeeded", log
    assert "--storage-path" in log
