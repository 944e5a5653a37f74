"""The fast tier's guard (`tests.support.fast_tier`): a test here whose set-up, body or tear-down
opens a socket, starts a process or imports torch fails, naming the tier it belongs in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fast_tier import guarded


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with guarded():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with guarded():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with guarded():
        return (yield)
