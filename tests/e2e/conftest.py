"""The e2e tier's own operator: the real one, with this machine's Pulumi install (the Python language
host and the provider plugins), on the session's local platform."""

from __future__ import annotations

import pytest

from strata_components.local.operator_host import operator_host
from strata_components.local.preflight import find_pulumi_with_python_host, operator_engine_flags


@pytest.fixture(scope="session")
def python_operator(platform, toolchain, tmp_path_factory):
    """The operator as `make up` starts it: its updates get this machine's CLI, hosts and plugins."""
    cli = find_pulumi_with_python_host()
    flags = operator_engine_flags()
    assert cli is not None and flags, "the e2e tier runs only where a Pulumi install with the Python host exists"
    host = operator_host(platform, toolchain, tmp_path_factory.mktemp("e2e-operator"), pulumi=cli,
                         extra_args=(*flags[2:], "--verbose"))
    host.start()
    yield host
    host.stop()
