"""Where a program comes from, and what a Stack's references resolve to. Imports services and api.

git.py, flux.py (Flux artifacts), archive.py (unpacking safely, and the size cap every source is held to;
light: the workspace agent imports it), work.py (the threads source work runs on, apart from the API calls'),
project.py (the materialised Pulumi project), references.py (envRefs, secretsRef, gitAuth, ... into the
values one update needs), workspace_program.py (a PKO v2 Workspace's environment and program).
"""
