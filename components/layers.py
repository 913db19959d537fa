"""The hand-off between layers: bootstrap -> platform -> team hand-off -> app team, through StackReferences only.

Each layer reads just what it needs from the layer below; secret outputs stay secret (a
StackReference returns them as secret Outputs) and nothing is copied by hand. The bootstrap and
platform stacks share the operator's state passphrase; each team gets a passphrase of its own,
derived from it, which encrypts that team's hand-off stack (its kubeconfig and namespace) and its
app stack, and nothing else.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import http.client
import ssl
import tempfile
import urllib.parse
from pathlib import Path

import pulumi

from .kubeconfig import kubeconfig_cluster, kubeconfig_user

# The Secret holding the state passphrase of the Stacks in its namespace: the shared one in the
# platform's namespace, the team's own in a team's namespace.
PASSPHRASE_SECRET = "strata-pulumi-passphrase"
# The organization of every stack on a file:// (DIY) backend.
DIY_ORGANIZATION = "organization"
# Project of the per-team hand-off stacks; also the name of the Program they run (the operator names
# a Program's project after the object).
HANDOFF_PROJECT = "strata-team-handoff"


def handoff_stack(team: str) -> str:
    """Fully qualified name of a team's hand-off stack."""
    return f"{DIY_ORGANIZATION}/{HANDOFF_PROJECT}/{team}"


def derive_team_passphrase(passphrase: str, team: str) -> str:
    """A team's state passphrase: HMAC-SHA256 of "team:<name>" keyed by the shared passphrase (hex).

    Knowing it reveals neither the shared passphrase nor another team's."""
    return hmac.new(passphrase.encode(), f"team:{team}".encode(), hashlib.sha256).hexdigest()


def team_passphrase(passphrase: pulumi.Input[str], team: str) -> pulumi.Output[str]:
    """`derive_team_passphrase` of a (secret) Output, computed inside `apply` and kept secret."""
    return pulumi.Output.secret(pulumi.Output.from_input(passphrase).apply(
        lambda value: derive_team_passphrase(value, team)))


def team_backend(backend: str, team: str) -> str:
    """A team's own state backend: `teams/<team>` under the platform's (a directory of a file:// backend,
    a prefix of a bucket's, its query options kept). Only the team's Stacks and its hand-off stack use it."""
    url = urllib.parse.urlsplit(backend)
    return urllib.parse.urlunsplit(url._replace(path=f"{url.path.rstrip('/')}/teams/{team}"))


def this_stack() -> str:
    """Fully qualified name of the running stack, as other layers reference it."""
    return f"{pulumi.get_organization() or DIY_ORGANIZATION}/{pulumi.get_project()}/{pulumi.get_stack()}"


@dataclasses.dataclass(frozen=True)
class ClusterAccess:
    """What the bootstrap stack hands the platform layer."""

    kubeconfig: pulumi.Output[str]
    """Admin kubeconfig (secret)."""
    server: pulumi.Output[str]
    """API server URL."""


@dataclasses.dataclass(frozen=True)
class TeamAccess:
    """What a team's hand-off stack hands that team's layer."""

    kubeconfig: pulumi.Output[str]
    """Kubeconfig of the team's ServiceAccount (secret)."""
    namespace: pulumi.Output[str]
    """The team's namespace."""


def read_cluster_access(bootstrap_stack: str, opts: pulumi.ResourceOptions | None = None) -> ClusterAccess:
    """The bootstrap stack's `kubeconfig` (kept secret) and `server` outputs."""
    reference = pulumi.StackReference(bootstrap_stack, opts=opts)
    return ClusterAccess(kubeconfig=pulumi.Output.secret(reference.require_output("kubeconfig")),
                         server=reference.require_output("server"))


def _decrypted(value, stack: str, name: str) -> str:
    # The engine elides the secrets of a referenced stack that this stack's passphrase cannot decrypt
    # (an empty object in place of the value) instead of failing: fail here, naming the stack.
    if not isinstance(value, str) or not value:
        raise ValueError(f"cannot decrypt output {name!r} of stack {stack}: this stack's passphrase is not the one "
                         f"{stack} is encrypted with (a team's hand-off stack opens with that team's passphrase only)")
    return value


def read_team_access(team_handoff_stack: str, opts: pulumi.ResourceOptions | None = None) -> TeamAccess:
    """The team's kubeconfig (kept secret) and namespace from its hand-off stack, which only the
    team's passphrase (the PULUMI_CONFIG_PASSPHRASE of the reading stack) decrypts."""
    reference = pulumi.StackReference(team_handoff_stack, opts=opts)
    kubeconfig = reference.require_output("kubeconfig").apply(
        lambda value: _decrypted(value, team_handoff_stack, "kubeconfig"))
    return TeamAccess(kubeconfig=pulumi.Output.secret(kubeconfig), namespace=reference.require_output("namespace"))


def list_status(kubeconfig: str, namespace: str) -> str:
    """What the API server answers this kubeconfig's identity when it lists ConfigMaps in `namespace`:
    "200 OK", or the refusal's status and reason (e.g. "403 Forbidden"). How a layer proves its boundary.

    One request by the standard library: the layers' environments carry no Kubernetes client (most of
    their size, copied for every Stack). A token or client-certificate kubeconfig, as the hand-offs write."""
    server, ca_data = kubeconfig_cluster(kubeconfig)
    credentials = kubeconfig_user(kubeconfig)
    unsupported = sorted(set(credentials) - {"token", "client-certificate-data", "client-key-data"})
    if unsupported:
        raise ValueError(f"list_status reads a kubeconfig whose user has a token or client-certificate-data and "
                         f"client-key-data; this one has {', '.join(unsupported)}: pass a hand-off's kubeconfig")
    tls = ssl.create_default_context(cadata=base64.b64decode(ca_data).decode() if ca_data else None)
    if "client-certificate-data" in credentials:  # ssl loads a client certificate from files only
        with tempfile.TemporaryDirectory(prefix="strata-list-status-") as keys:
            certificate, key = Path(keys, "client.crt"), Path(keys, "client.key")
            certificate.write_bytes(base64.b64decode(credentials["client-certificate-data"]))
            key.write_bytes(base64.b64decode(credentials["client-key-data"]))
            tls.load_cert_chain(certificate, key)
    url = urllib.parse.urlsplit(server)
    headers = {"Authorization": f"Bearer {credentials['token']}"} if "token" in credentials else {}
    connection = http.client.HTTPSConnection(url.hostname, url.port or 443, context=tls, timeout=30)
    try:
        connection.request("GET", f"{url.path.rstrip('/')}/api/v1/namespaces/{urllib.parse.quote(namespace)}"
                                  "/configmaps?limit=1", headers=headers)
        response = connection.getresponse()
        return f"{response.status} {response.reason}"
    finally:
        connection.close()
