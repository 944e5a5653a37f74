"""What the integrity-checker's handlers and scrub depend on: ports, never Redis or NATS classes.

* ``store``: the storage root it verifies and quarantines in (`ObjectStore`);
* ``publisher``: where verdicts go (`Publisher`, deduplicated on the event id);
* ``registry``: read only. The handlers ask the records of a fetched batch of commits at once
  and one checkpoint's record (`CheckerRegistry`: is it decided already, did the registrar
  apply this release); the scrub lists the valid ones (`CheckpointReader`). The registrar alone
  writes the registry;
  the copies also read each job's tier (`CopyRegistry`);
* ``clock``: injected time (`Clock`).
"""

from __future__ import annotations

from typing import Protocol

from ckpt_ha.bus.port import Publisher
from ckpt_ha.core.clock import Clock
from ckpt_ha.core.tiers import TierChoice
from ckpt_ha.registry.port import CheckpointBatchLookup, CheckpointLookup, CheckpointReader
from ckpt_ha.storage.port import ObjectStore

__all__ = [
    "CheckerRegistry",
    "CheckpointLookup",
    "CheckpointReader",
    "Clock",
    "CopyRegistry",
    "ObjectStore",
    "Publisher",
]


class CheckerRegistry(CheckpointBatchLookup, CheckpointReader, Protocol):
    """What the handlers read: a batch's records at once, one record, a job's records."""


class CopyRegistry(CheckpointReader, Protocol):
    """What the copies read: the valid records, and each job's tier (does it replicate)."""

    async def tier_of(self, job_id: str) -> TierChoice: ...
