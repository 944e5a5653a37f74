"""`ckpt-ha run`'s settings: the shared ones plus the login it hands to training processes."""

from __future__ import annotations

import dataclasses

from pydantic import SecretStr

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.runtime.settings import ServiceSettings


class RunnerSettings(ServiceSettings):
    """The shared settings plus the NATS login a training process connects as (the ``job``
    principal), never the runner's own."""

    job_nats_user: str | None = None
    """The NATS user training processes connect as (``job``); None: the runner's own login."""
    job_nats_password: SecretStr | None = None
    """That user's password."""

    def job_bus(self) -> BusConfig | None:
        """The bus as training processes use it; None when no job login is configured (they
        then get the runner's, as on a NATS without a ``job`` user)."""
        if self.job_nats_user is None:
            return None
        return dataclasses.replace(
            self.bus(), user=self.job_nats_user, password=self.job_nats_password
        )
