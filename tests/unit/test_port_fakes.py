"""The in-memory fakes of the registry, watch-state and publisher ports pass the same contract
suites as their real adapters (`tests/integration/test_port_adapters.py`)."""

from __future__ import annotations

import pytest

from ckpt_ha.contracts import Envelope, EventData
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.watcher_state import WatchStateBackend
from tests.support.publisher_contract import PublisherContract, Stored
from tests.support.registry_contract import RegistryContract
from tests.support.watch_state_contract import OpenState, WatchStateContract


class TestInMemoryRegistry(RegistryContract):
    @pytest.fixture
    def registry(self) -> InMemoryRegistry:
        return InMemoryRegistry()


class TestInMemoryWatchState(WatchStateContract):
    @pytest.fixture
    def open_state(self) -> OpenState:
        return WatchStateBackend().open


class TestRecordingPublisher(PublisherContract):
    @pytest.fixture
    def publisher(self) -> RecordingPublisher:
        return RecordingPublisher()

    @pytest.fixture
    def stored(self, publisher: RecordingPublisher) -> Stored:
        async def events() -> list[Envelope[EventData]]:
            return list(publisher.events)

        return events
