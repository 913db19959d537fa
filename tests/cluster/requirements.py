"""The cluster tier needs what the realnode tier needs (its profile's own tools are built on first use), and
the Python language host and provider plugins of a Pulumi install: the operator image it pushes carries them
so that every layer runs in the cluster (`strata image build` refuses to build it without them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from strata_components.local.preflight import missing_dev_stack_requirements


def missing_cluster_requirements() -> list[str]:
    spec = importlib.util.spec_from_file_location("realnode_requirements",
                                                  Path(__file__).parents[1] / "realnode" / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [*module.missing_realnode_requirements(), *missing_dev_stack_requirements()]
