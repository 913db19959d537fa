"""Strata operator: runs `pulumi.com/v1` Stack and Program objects with the Pulumi engine, on Kopf.

Manifests written for the Pulumi Kubernetes Operator (v1 and v2) apply unchanged. The package is
split so that everything that decides is pure and unit-tested alone (spec, planning, backoff,
status, redaction) and the Kopf handlers only fetch, call, and write back.
"""

GROUP = "pulumi.com"
VERSION = "v1"
# PKO v2's Workspace and Update API
AUTO_GROUP, AUTO_VERSION = "auto.pulumi.com", "v1alpha1"
FINALIZER = "finalizer.stack.pulumi.com"
RECONCILE_REQUEST_ANNOTATION = "pulumi.com/reconciliation-request"
FLUX_REQUESTED_AT_ANNOTATION = "reconcile.fluxcd.io/requestedAt"
