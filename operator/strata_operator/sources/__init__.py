"""Where a program comes from, and what a Stack's references resolve to. Imports services and api.

git.py, flux.py (Flux artifacts), archive.py (unpacking safely; light: the workspace agent imports it),
project.py (the materialised Pulumi project), references.py (envRefs, secretsRef, gitAuth, ... into the
values one update needs), workspace_program.py (a PKO v2 Workspace's environment and program).
"""
