"""The behaviour every pin store must show (R15), written once and run against the in-memory
fake and the Redis owner (`ckpt_ha.registry.pins.RedisPins`).

Subclass `PinsContract` in a `Test*` class and give it a `pins` fixture returning an empty store.
"""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_ha.core.pins import Pin

P1 = Pin("c-300", "restored from", "plan-a", 300, 2)
P2 = Pin("c-200", "fallback", "plan-a", 300, 2)


class PinsContract:
    @pytest.fixture
    def pins(self) -> Any:
        raise NotImplementedError("backend test classes provide the pin store")

    async def test_a_job_without_pins_has_none(self, pins: Any) -> None:
        assert await pins.pins("job-none") == []

    async def test_pins_round_trip_every_field_in_id_order(self, pins: Any) -> None:
        await pins.pin("job-a", [P1, P2])
        assert await pins.pins("job-a") == [P2, P1]
        assert await pins.pins("job-b") == []

    async def test_pinning_again_replaces_by_checkpoint_id(self, pins: Any) -> None:
        await pins.pin("job-a", [P1])
        newer = Pin("c-300", "restored from", "plan-b", 400, 3)
        await pins.pin("job-a", [newer])
        assert await pins.pins("job-a") == [newer]

    async def test_unpin_releases_only_the_given_ids_and_ignores_unknown(self, pins: Any) -> None:
        await pins.pin("job-a", [P1, P2])
        await pins.unpin("job-a", ["c-200", "nope"])
        assert await pins.pins("job-a") == [P1]
        await pins.unpin("job-a", [])
        assert await pins.pins("job-a") == [P1]
        await pins.unpin("job-a", ["c-300"])
        assert await pins.pins("job-a") == []
