"""The cluster tier needs what the realnode tier needs (its profile's own tools are built on first use)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def missing_cluster_requirements() -> list[str]:
    spec = importlib.util.spec_from_file_location("realnode_requirements",
                                                  Path(__file__).parents[1] / "realnode" / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.missing_realnode_requirements()
