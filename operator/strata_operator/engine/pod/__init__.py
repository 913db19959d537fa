"""The pod executor: a workspace pod per Stack (or PKO v2 Workspace) in its namespace, under its
ServiceAccount, whose agent runs the process executor inside.

executor.py (`PodEngine`: the pod made ready, the source uploaded, the operation asked for),
workspace_pod.py (the pod, its ServiceAccount and agent Secret: pure builders), agent.py (`python -m
strata_operator.engine.pod.agent`, the pod's process), bundle.py (`python -m
strata_operator.engine.pod.bundle`: the agent's runtime copied for an image that is not the operator's).
"""
