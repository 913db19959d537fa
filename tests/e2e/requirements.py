"""What the e2e tier needs that cannot be built here (shared with `make up`'s preflight)."""

from strata_components.local.preflight import missing_dev_stack_requirements


def missing_e2e_requirements() -> list[str]:
    return missing_dev_stack_requirements()
