"""In-memory R15 pins: the fake of `ckpt_ha.registry.pins.RedisPins` (same contract suite,
``tests/support/pins_contract.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from ckpt_ha.core.pins import Pin


class InMemoryPins:
    def __init__(self) -> None:
        self.by_job: dict[str, dict[str, Pin]] = {}

    async def pins(self, job: str) -> list[Pin]:
        return sorted(self.by_job.get(job, {}).values(), key=lambda p: p.checkpoint_id)

    async def pin(self, job: str, pins: Sequence[Pin]) -> None:
        self.stage(job, pins)

    def stage(self, job: str, pins: Sequence[Pin]) -> None:
        """What `RedisPins.stage` queues on a transaction, applied at once (the fake of the
        coordinator's state calls it inside its own all-or-nothing write)."""
        if pins:
            self.by_job.setdefault(job, {}).update({p.checkpoint_id: p for p in pins})

    async def unpin(self, job: str, ids: Sequence[str]) -> None:
        held = self.by_job.get(job, {})
        for checkpoint_id in ids:
            held.pop(checkpoint_id, None)
        if not held:
            self.by_job.pop(job, None)
