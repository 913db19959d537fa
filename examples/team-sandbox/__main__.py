"""A team sandbox on a cluster you already have, built from Strata's components (see README.md here:
the cluster needs Strata's CRDs and a running operator).

    python -m venv venv && venv/bin/pip install -r requirements.txt   # strata_components from this checkout
    pulumi config set kubeconfigPath ~/.kube/config
    pulumi config set team demo
    pulumi config set --secret statePassphrase ...   # the sandbox Stack's passphrase secrets
    pulumi config set backend file://~/.local/state/strata/examples   # optional: where the Stack's state lives
    pulumi up
"""

import pulumi
import pulumi_kubernetes as k8s

from strata_components.cluster import Cluster
from strata_components.stack import Program, Stack
from strata_components.team import TeamEnvironment

config = pulumi.Config()
cluster = Cluster("cluster", {"mode": "existing", "existing": {"kubeconfig_path": config.require("kubeconfigPath")}})
team_name = config.get("team") or "demo"
# The operator's own home (`~` is the operator's), which outlives its restarts; it creates the directory.
backend = config.get("backend") or "file://~/.local/state/strata/examples"
team_args = {"provider": cluster.provider, "team": team_name, "server": cluster.server}
if backend.startswith("file://"):
    # The one directory of the operator's host the team's programs may write (the operator runs them sandboxed).
    team_args["file_backend"] = backend
team = TeamEnvironment("sandbox", team_args)
kube = pulumi.ResourceOptions(provider=cluster.provider, depends_on=[team])
hello = Program("hello", {"namespace": team.namespace, "program": {
    "resources": {"greeting": {"type": "pulumi:index:Stash", "properties": {"input": "hello from strata"}}},
    "outputs": {"greeting": "${greeting.output}"}}}, kube)
# A file:// backend uses passphrase secrets: without PULUMI_CONFIG_PASSPHRASE the operator's update
# cannot even create the stack. The passphrase reaches the cluster only inside this Secret.
passphrase = k8s.core.v1.Secret("hello-passphrase", metadata={"name": "hello-passphrase", "namespace": team.namespace},
                                string_data={"passphrase": config.require_secret("statePassphrase")}, opts=kube)
Stack("hello", {"namespace": team.namespace, "spec": {
    "stack": "organization/hello/dev", "program_ref": {"name": "hello"}, "backend": backend,
    "env_refs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret",
                                              "secret": {"name": "hello-passphrase", "key": "passphrase"}}},
    "service_account_name": f"team-{team_name}"}},
      pulumi.ResourceOptions(provider=cluster.provider, depends_on=[hello, passphrase]))

pulumi.export("teamKubeconfig", team.kubeconfig)
