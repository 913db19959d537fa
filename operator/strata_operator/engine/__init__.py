"""The engine port (port.py: the one interface to Pulumi) and its two executors, each in a sub-package:
process/ (a forked worker per operation on the operator's host, Python virtualenvs, provider plugins)
and pod/ (a workspace pod per Stack, its agent, the agent's runtime for foreign images).

Imports sources, decisions, services and api. Controllers reach an executor only through the port,
except to construct one at startup.
"""
