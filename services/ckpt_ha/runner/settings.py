"""`ckpt-ha run`'s settings: the shared ones plus the login it hands to training processes."""

from __future__ import annotations

import dataclasses

from pydantic import Field, SecretStr

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.runtime.settings import ServiceSettings


class RunnerSettings(ServiceSettings):
    """The shared settings plus the NATS login a training process connects as (the ``job``
    principal), never the runner's own, and its attempts' heartbeat interval and deadline."""

    job_nats_user: str | None = None
    """The NATS user training processes connect as (``job``); None: the runner's own login."""
    job_nats_password: SecretStr | None = None
    """That user's password."""
    heartbeat_s: float = Field(default=10.0, ge=0)
    """How often the runner publishes ``job.heartbeat`` while an attempt runs, unless
    ``--heartbeat-s`` says (0: never, and its attempts are never declared lost)."""
    deadline_s: float | None = Field(default=None, gt=0)
    """Silence after which the restore-coordinator declares an attempt lost, unless
    ``--deadline-s`` says; None: the job's tier's (`ckpt-ha tier show`). Carried by each
    ``job.started``, so the coordinator (and a rebuild) reads it from the event."""

    hang_after_s: float | None = Field(default=None, ge=0)
    """Silence of the training's progress (outside saves, evaluations and its first steps)
    after which a live attempt is hung, unless ``--hang-after-s`` says; None: adaptive (from
    the job's own step intervals); 0: never."""

    def job_bus(self) -> BusConfig | None:
        """The bus as training processes use it; None when no job login is configured (they
        then get the runner's, as on a NATS without a ``job`` user)."""
        if self.job_nats_user is None:
            return None
        return dataclasses.replace(
            self.bus(), user=self.job_nats_user, password=self.job_nats_password
        )
