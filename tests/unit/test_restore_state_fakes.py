"""The in-memory fakes of the coordinator's state and of the pins pass the same contract suites
as their Redis owners (``tests/integration/test_restore_state_redis.py``)."""

from __future__ import annotations

import pytest

from tests.support.fakes.pins import InMemoryPins
from tests.support.fakes.restores import InMemoryRestores
from tests.support.pins_contract import PinsContract
from tests.support.restores_contract import TRAJECTORY_LIMIT, RestoresContract


class TestInMemoryPins(PinsContract):
    @pytest.fixture
    def pins(self) -> InMemoryPins:
        return InMemoryPins()


class TestInMemoryRestores(RestoresContract):
    @pytest.fixture
    def stores(self) -> tuple[InMemoryRestores, InMemoryPins]:
        pins = InMemoryPins()
        return InMemoryRestores(pins, trajectory_limit=TRAJECTORY_LIMIT), pins
