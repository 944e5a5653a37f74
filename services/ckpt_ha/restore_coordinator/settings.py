from __future__ import annotations

from pydantic import Field

from ckpt_ha.runtime.settings import ServiceSettings


class RestoreCoordinatorSettings(ServiceSettings):
    """The shared settings plus the lease, the graces and the per-job state it keeps."""

    lease_ttl_s: float = Field(default=30.0, gt=0)
    """How long one replica may hold the right to decide a failure before another takes over
    (it crashed)."""
    load_failed_grace_s: float = Field(default=3.0, ge=0)
    """How long a failure of a resumed attempt that never reported progress waits for its
    ``resume.load_failed``, so the fallback (not the checkpoint that failed to load) is
    planned."""
    verification_grace_s: float = Field(default=40.0, ge=0)
    """How long after a failure a newer checkpoint still pending verification (or committed
    before the failure and not registered yet) is waited for before the failure is decided
    with what is valid (the failure is nak'ed meanwhile: keep it inside the bus's retry budget,
    51 s by default)."""
    trajectory_limit: int = Field(default=10_000, ge=1)
    """Progress steps kept per job for continuity checks."""
    state_ttl_s: int = Field(default=30 * 24 * 3600, ge=60)
    """The coordinator's per-job state expires after this long without a write."""
    lost_check_interval_s: float = Field(default=5.0, ge=0)
    """How often the replica holding the ``lost`` loop lease looks for attempts past their
    heartbeat deadline (0: never; then no attempt is ever declared lost). A lost attempt is
    declared within its deadline plus this."""
