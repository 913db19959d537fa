"""Strata operator: runs `pulumi.com/v1` Stack and Program objects with the Pulumi engine, on Kopf.

Manifests written for the Pulumi Kubernetes Operator (v1 and v2) apply unchanged. The package is laid
out by concern, each sub-package a room whose `__init__` says what lives there:

  api/          the APIs and their pure meaning: Stack, Program, PKO v2 Workspace and Update parsed and
                validated naming the field, status builders, label selectors and shards; the CRDs and RBAC as
                YAML beside them
  decisions/    what to do, pure and unit-tested: planning, backoff, approval, rollout, outputs digests,
                leader election's rules
  sources/      where a program comes from (git, Flux, Program objects, archives) and the values a
                Stack's references resolve to
  engine/       the engine port (port.py) and its two executors: process/ (forked workers, virtualenvs,
                plugins) and pod/ (the workspace pod, its agent, the agent's runtime bundle)
  services/     the few cross-cutting services: Kubernetes calls, redaction, metrics, Events, memory
  controllers/  one module per kind (Stack, Program, Workspace, Update) plus leadership, thin: fetch,
                call the pure parts, run the engine, write back
  main.py       the entry points (`strata operator run`, `python -m strata_operator`)

Imports go one way, and tests/unit/operator/test_layout.py holds them to it:

  main -> controllers -> engine -> sources -> services -> api
                      -> decisions ------------------> api

that is, a room imports only from rooms to its right: controllers from any other room; engine from
sources, decisions, services and api; sources from services and api; decisions and services from api
alone; api from nothing of ours.
"""
