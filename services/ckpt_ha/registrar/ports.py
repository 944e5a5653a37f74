"""What the registrar's handlers depend on: ports, never Redis or NATS classes.

* ``registry``: the registrar is the registry's only live writer (`RegistrarRegistry`: project
  a batch of checkpoint events, and read a job's tier for the `registered` announcement);
* ``publisher``: where follow-ups go (`Publisher`, deduplicated on the event id, so a
  redelivered batch re-publishes its follow-ups without new facts);
* ``clock``: injected time (`Clock`).
"""

from __future__ import annotations

from typing import Protocol

from ckpt_ha.bus.port import Publisher
from ckpt_ha.core.clock import Clock
from ckpt_ha.core.tiers import TierChoice
from ckpt_ha.registry.port import RegistryWriter

__all__ = ["Clock", "Publisher", "RegistrarRegistry"]


class RegistrarRegistry(RegistryWriter, Protocol):
    async def tier_of(self, job_id: str) -> TierChoice:
        """The job's tier (chosen, else declared, else the cheapest)."""
        ...
