"""The system tier's session hooks: here rather than in tests/system/faults/conftest.py so that
pytest-xdist's controller, which collects nothing, prints the fault figures its workers report."""

from __future__ import annotations

from typing import Any

import pytest

from tests.system.faults.book import Gatherer, summary


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Gatherer(config), "fault-figures-gatherer")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    summary(terminalreporter, config)
