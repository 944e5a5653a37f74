"""The fault suite's fixtures: one stack for the whole package, the registry, and the book the
figures go to (`tests.system.faults.book`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from ckpt_ha.registry.redis_registry import Registry
from tests.system.faults.book import FigureBook
from tests.system.faults.stack import FaultStack, running_stack


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> FigureBook:
    return FigureBook(request.config, request.node)


@pytest.fixture(scope="package")
def fault_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    """One stack for every fault of the package, stopped when the last one is done."""
    with running_stack(tmp_path_factory.mktemp("faults") / "home") as fs:
        yield fs


@pytest.fixture
async def registry(fault_stack: FaultStack) -> AsyncIterator[Registry]:
    reg = Registry.from_url(fault_stack.redis_url)
    yield reg
    await reg.close()
