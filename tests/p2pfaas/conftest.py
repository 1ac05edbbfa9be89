"""Fixtures of the command-line tests."""

from __future__ import annotations

import pytest

from stack_processes import UpRuns


@pytest.fixture
def start_up():
    """Start ``p2pfaas up`` as a user does; whatever the test's outcome, it is ended afterwards."""
    runs = UpRuns()
    yield runs
    runs.end()
