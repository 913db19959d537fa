"""Fixtures for the component tests: a fresh Pulumi mock runtime per test."""

from __future__ import annotations

from typing import Callable

import pytest
from strata_mocks import Harness


@pytest.fixture
def harness() -> Harness:
    return Harness()


@pytest.fixture
def make_harness() -> Callable[..., Harness]:
    return Harness
