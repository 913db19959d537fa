"""The APIs the operator serves and their pure meaning; imports nothing else of strata_operator.

stack.py (the Stack spec), program.py (the Program, its status), validation.py (issues that name the
field), status.py (Stack status builders), workspace.py, update.py and auto_conditions.py (PKO v2's
`auto.pulumi.com` Workspace and Update), workspace_values.py (what a workspace pod resolves itself; light
enough for the agent), workspace_template.py (what a team's workspace pod template may ask for) and
workspace_limits.py (the resources and volume sizes a workspace pod keeps; light too). crds/ and rbac/
are the CustomResourceDefinitions and the operator's RBAC as YAML, read by the Operator component
(package data).
"""

GROUP = "pulumi.com"
VERSION = "v1"
# PKO v2's Workspace and Update API
AUTO_GROUP, AUTO_VERSION = "auto.pulumi.com", "v1alpha1"
FINALIZER = "finalizer.stack.pulumi.com"
RECONCILE_REQUEST_ANNOTATION = "pulumi.com/reconciliation-request"
FLUX_REQUESTED_AT_ANNOTATION = "reconcile.fluxcd.io/requestedAt"
# A stopping operator (an upgrade, a restart) lets running updates finish for up to this long before it
# cancels them; the in-cluster Deployment's termination grace period covers it.
SHUTDOWN_DRAIN_SECONDS = 300
# Set on a container whose memory limit is its own (a workspace pod, the in-cluster operator): the field that
# sets its resources, which an update killed there for out of memory names as the one to raise.
RESOURCES_FIELD_ENV = "STRATA_RESOURCES_FIELD"
# On a namespace, set by the platform (the team component): the directory the namespace's Stacks may keep
# file:// state in under the process executor, whose sandbox binds it (nothing else of the host is writable).
FILE_BACKEND_ANNOTATION = "strata.dev/file-backend"
