from __future__ import annotations

from pydantic import Field

from ckpt_ha.runtime.settings import ServiceSettings


class RestoreCoordinatorSettings(ServiceSettings):
    """``CKPT_HA_LEASE_TTL_S``: how long one replica may hold the right to decide a failure
    before another takes over (it crashed). ``CKPT_HA_LOAD_FAILED_GRACE_S``: how long a failure
    of a resumed attempt that never reported progress waits for its ``resume.load_failed``, so
    the fallback (not the checkpoint that failed to load) is planned.
    ``CKPT_HA_VERIFICATION_GRACE_S``: how long after a failure a newer checkpoint still pending
    verification is waited for before the failure is decided with what is valid (the failure
    is nak'ed meanwhile: keep it inside the bus's retry budget, 51 s by default).
    ``CKPT_HA_TRAJECTORY_LIMIT``: progress steps kept per job for continuity checks.
    ``CKPT_HA_STATE_TTL_S``: the coordinator's per-job state expires after this long idle."""

    lease_ttl_s: float = Field(default=30.0, gt=0)
    load_failed_grace_s: float = Field(default=3.0, ge=0)
    verification_grace_s: float = Field(default=40.0, ge=0)
    trajectory_limit: int = Field(default=10_000, ge=1)
    state_ttl_s: int = Field(default=30 * 24 * 3600, ge=60)
