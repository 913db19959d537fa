"""A team sandbox on a cluster you already have, built from Strata's components.

    pip install -r requirements.txt           # installs strata_components from this checkout
    pulumi config set kubeconfigPath ~/.kube/config
    pulumi config set team demo
    pulumi up
"""

import pulumi

from strata_components.cluster import Cluster
from strata_components.stack import Program, Stack
from strata_components.team import TeamEnvironment

config = pulumi.Config()
cluster = Cluster("cluster", {"mode": "existing", "existing": {"kubeconfig_path": config.require("kubeconfigPath")}})
team_name = config.get("team") or "demo"
team = TeamEnvironment("sandbox", {"provider": cluster.provider, "team": team_name, "server": cluster.server})
kube = pulumi.ResourceOptions(provider=cluster.provider, depends_on=[team])
hello = Program("hello", {"namespace": team.namespace, "program": {
    "resources": {"greeting": {"type": "pulumi:index:Stash", "properties": {"input": "hello from strata"}}},
    "outputs": {"greeting": "${greeting.output}"}}}, kube)
Stack("hello", {"namespace": team.namespace, "spec": {"stack": "organization/hello/dev", "program_ref": {"name": "hello"},
                                                     "backend": "file:///tmp/strata-state",
                                                     "service_account_name": f"team-{team_name}"}},
      pulumi.ResourceOptions(provider=cluster.provider, depends_on=[hello]))

pulumi.export("teamKubeconfig", team.kubeconfig)
