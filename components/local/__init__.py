"""The local platform and the `strata` command's host side: they need the `operator` extra.

A bare `pip install strata` is the component library (pyproject.toml); everything here (and a Cluster
or Operator in mode `local`, whose providers import it) says which extra it lacks, naming the fix,
rather than failing later on one missing module.
"""

from importlib.util import find_spec

# What the `operator` extra installs that this package and the operator import (import names).
OPERATOR_EXTRA_MODULES = ("kopf", "kubernetes", "pydantic", "cryptography", "prometheus_client", "uv", "starlette",
                          "uvicorn", "jinja2")

_missing = [module for module in OPERATOR_EXTRA_MODULES if find_spec(module) is None]
if _missing:
    raise ImportError(f"the local platform and the `strata` command need the operator extra ({', '.join(_missing)} "
                      "not installed); fix: pip install 'strata[operator]' (this installation has the component "
                      "library only)", name=__name__)
