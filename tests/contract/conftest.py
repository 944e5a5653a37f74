"""The fast tier's guard, as in tests/unit (`tests.support.fast_tier`): a test here whose set-up,
body or tear-down opens a socket, starts a process or imports torch fails."""

from tests.unit.conftest import (  # noqa: F401 - hooks pytest finds by name
    pytest_runtest_call,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)
