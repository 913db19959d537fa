"""Flux's multi-tenancy lockdown, as Flux documents it, in one place for both ways Flux runs here: as
Deployments the Flux component patches, and as the local platform's host processes.

Locked down, kustomize- and helm-controller apply a Kustomization or HelmRelease as its
`serviceAccountName` (impersonated), or as the `default` ServiceAccount of its namespace (no rights)
when it names none; no controller follows a reference into another namespace, and kustomize-controller
refuses remote bases. A tenant's sync then reaches exactly what its ServiceAccount may touch. The
cluster-wide sync runs as kustomize-controller's own ServiceAccount (`CLUSTER_SYNC_SERVICE_ACCOUNT`),
which the Flux install binds to cluster-admin.
"""

LOCKDOWN_FLAGS = {
    "kustomize-controller": ("--no-cross-namespace-refs=true", "--no-remote-bases=true",
                             "--default-service-account=default"),
    "helm-controller": ("--no-cross-namespace-refs=true", "--default-service-account=default"),
    "notification-controller": ("--no-cross-namespace-refs=true",),
}
CLUSTER_SYNC_SERVICE_ACCOUNT = "kustomize-controller"
