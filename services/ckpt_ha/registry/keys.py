"""THE key layout of the checkpoint registry in Redis. Nothing else formats these keys.

All keys live under one prefix, so tests and stacks can share a Redis:

* ``<p>:ckpt:<id>``       JSON `CheckpointRecord` (state, identity, history, pins, tombstone)
* ``<p>:job:<job>``       sorted set of checkpoint ids by step (-1: no step known)
* ``<p>:state:<state>``   set of checkpoint ids in that state
* ``<p>:uri:<uri>``       set of checkpoint ids ever written at that location (display only: a
  resubmitted job writing the same path gets a new checkpoint id)
* ``<p>:jobs``            set of job ids
* ``<p>:applied-at``      sorted set: event id → its event's time (ms); dedupe within
  `ckpt_ha.registry.redis_registry.APPLIED_WINDOW_S`, trimmed past it (older replays are
  recognised by the record's own history)
* ``<p>:owner:<job>``     the project that owns a job's checkpoints (R5)
* ``<p>:project:<proj>``  set of job ids the project owns
* ``<p>:owner-log:<job>`` list of ownership changes (JSON `OwnershipChange`), oldest first
* ``<p>:tier:<job>``      JSON `TierRecord`: the job's latest explicitly chosen tier (R13)
* ``<p>:tier-log:<job>``  list of tier choices (JSON `TierRecord`), oldest first
* ``<p>:tier-declared:<job>`` the tier the job's latest ``job.started`` declared
* ``<p>:fence:<job>``     hash run id → the latest attempt planned for that run (from
  ``resume.planned``): a commit of an older attempt of the run is fenced (R17)
* ``<p>:reconcile-log``   list of unregistered storage objects deleted by ``reconcile --delete``
* ``<p>:stream``          the identity of the event stream the registry is built from (its name
  and creation time): a rebuild refuses a stream deleted and created again

All but the reconcile log and the stream's identity are a projection of the event stream
(`REBUILT`): the first eleven from the checkpoint events (``applied``, the unbounded set of
every id that earlier versions kept, is cleared by a rebuild too), the fences of
``resume.planned`` (the registrar records them live), the declared tiers of ``job.started``
(the retention-janitor
records them live). A rebuild clears and replays them. The reconcile log is not in the stream
and survives a rebuild; a rebuild checks the stream's identity before it clears anything and
records it after. Other owners keep keys under the prefix, projections of the stream too,
cleared and replayed by the same rebuild: the restore-coordinator's state
(`ckpt_ha.restore_coordinator.store`, ``<p>:coord:*``), the R15 pins (`ckpt_ha.registry.pins`,
``<p>:pins:<job>``) and the retention-janitor's view of resumes
(`ckpt_ha.retention_janitor.store`, ``<p>:janitor:*``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_ha.contracts.checkpoint import CheckpointState

REBUILT = (
    "ckpt:",
    "job:",
    "state:",
    "uri:",
    "jobs",
    "applied",
    "applied-at",
    "owner:",
    "project:",
    "owner-log:",
    "tier:",
    "tier-log:",
    "tier-declared:",
    "fence:",
)
"""Key spaces (after ``<p>:``) of this layout that are a projection of the event stream."""

TRANSIENT = ("lease:", "coord:lease:", "coord:heard")
"""Key spaces (after ``<p>:``) of other owners that are neither in the stream nor needed from
it: the loop leases (`ckpt_ha.registry.leases`), the coordinator's lease on a failure and its
note of when it last heard from each watched attempt (`ckpt_ha.restore_coordinator.store`). Services
running during a rebuild keep taking them."""


@dataclass(frozen=True)
class RegistryKeys:
    """The registry's keys under one prefix."""

    prefix: str

    def _k(self, *parts: str) -> str:
        # The per-item keys below are f-strings of the same shape: one is built per key read
        # or written, several per event.
        return ":".join((self.prefix, *parts))

    def checkpoint(self, checkpoint_id: str) -> str:
        return f"{self.prefix}:ckpt:{checkpoint_id}"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def state(self, state: CheckpointState | str) -> str:
        return f"{self.prefix}:state:{state.value if isinstance(state, CheckpointState) else state}"

    def uri(self, uri: str) -> str:
        return f"{self.prefix}:uri:{uri}"

    @property
    def jobs(self) -> str:
        return self._k("jobs")

    @property
    def applied(self) -> str:
        return self._k("applied-at")

    def owner(self, job_id: str) -> str:
        return f"{self.prefix}:owner:{job_id}"

    def project(self, project: str) -> str:
        return f"{self.prefix}:project:{project}"

    def owner_log(self, job_id: str) -> str:
        return f"{self.prefix}:owner-log:{job_id}"

    def tier(self, job_id: str) -> str:
        return f"{self.prefix}:tier:{job_id}"

    def tier_log(self, job_id: str) -> str:
        return f"{self.prefix}:tier-log:{job_id}"

    def tier_declared(self, job_id: str) -> str:
        return f"{self.prefix}:tier-declared:{job_id}"

    def fence(self, job_id: str) -> str:
        return f"{self.prefix}:fence:{job_id}"

    @property
    def stream(self) -> str:
        return self._k("stream")

    @property
    def reconcile_log(self) -> str:
        return self._k("reconcile-log")

    @property
    def everything(self) -> str:
        """SCAN pattern for every key under the prefix (the registry's and its neighbours')."""
        return f"{self.prefix}:*"

    def is_transient(self, key: str) -> bool:
        """Whether ``key`` is a lease (`TRANSIENT`): never compared, never a reason to refuse."""
        return key.removeprefix(f"{self.prefix}:").startswith(TRANSIENT)

    def is_rebuilt(self, key: str) -> bool:
        """Whether ``key`` belongs to a key space of this layout the event stream rebuilds."""
        rest = key.removeprefix(f"{self.prefix}:")
        if rest == key:
            return False
        return any(rest == space if ":" not in space else rest.startswith(space)
                   for space in REBUILT)  # fmt: skip
