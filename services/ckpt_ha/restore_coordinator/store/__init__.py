"""The restore-coordinator's store: the one writer of its memory in Redis, ``<p>:coord:*``.

The coordinator writes it (its handlers reach it through their `RestoreState` port, and every
write goes through `ckpt_ha.restore_coordinator.projection`, one event at a time); other
code reads it through the typed read API it extends (`ckpt_ha.restore_coordinator.api`:
`failures`, `plan`, `verdict`, `started`). Nothing else formats these
keys. One class, `RedisRestores`, in parts by concern: `store.base` (client, expiry, replay),
`store.progress`, `store.decisions`, `store.watches`, `store.attention`; its Lua scripts are
`store/lua/*.lua`.

Keys (``<p>`` is the registry prefix; every read per event is a handful of O(1) commands in one
or two round trips, whatever the number of checkpoints in the registry; a burst of failures
takes one script call to record a round's failures and read their contexts,
``lua/failures.lua``, and one to store its decisions with their plans, restarts and pins,
``lua/decisions.lua``):

* ``<p>:coord:started:<job>:<attempt>``  JSON `Started`: the attempt's policy and restore target
* ``<p>:coord:traj:<job>``               hash step → JSON progress point (pre-failure trajectory)
* ``<p>:coord:trajidx:<job>``            sorted set of the steps in it (bounded: oldest trimmed)
* ``<p>:coord:last:<job>:<attempt>``     JSON last progress point of that attempt
* ``<p>:coord:failures:<job>``           hash attempt → JSON failure (signature, side, time)
* ``<p>:coord:restarts:<job>``           sorted set plan id → time planned (restart loop)
* ``<p>:coord:restarted``                sorted set job → time of its latest planned restart
  (the index `recent_restarts` reads; trimmed to ``ttl_s`` as it is written)
* ``<p>:coord:storage:<job>``            sorted set → time of each infrastructure-side failure
* ``<p>:coord:excluded:<job>``           set of what failed to load (never again): a checkpoint
  id (everywhere), or ``["<id>","<uri>"]`` (that location of it: a primary or one copy)
* ``<p>:coord:decision:<job>:<attempt>`` JSON `DecisionRecord`: the events decided for that
  failed attempt (plan or escalation) and whether they were published; one per failure
* ``<p>:coord:lease:<job>:<attempt>``    SET NX PX: who is deciding that failure right now
  (`ckpt_ha.registry.leases.acquire`)
* ``<p>:coord:plan:<plan>``              JSON `PlanRecord` (what the plan restored, for whom)
* ``<p>:coord:obs:<plan>``               list of the resumed attempt's first progress points
* ``<p>:coord:verdict:<plan>``           ``verified`` / ``diverged`` (SET NX: one verdict)
* ``<p>:coord:watch:<job>``              JSON `Watch`: the job's latest attempt, its last sign
  of life and its heartbeat deadline (or a tombstone: it ended)
* ``<p>:coord:due``                      sorted set job → unix time its watched attempt is lost
  (only attempts with a deadline that have not ended)
* ``<p>:coord:attention``                 hash job → ``<time>|<status>|<reason>``: the job needs
  someone (`Attention`: escalated, lost, diverged, load_failed) since that time; cleared by an
  event that ends it (no expiry: a page stays until someone acts)
* ``<p>:coord:heard``                    sorted set ``job|run|attempt`` → unix time (the
  coordinator's clock) a sign of life of that attempt was last handled: transient (not in the
  stream, not rebuilt), dropped when its watch ends

Every key but the leases and ``heard`` is a projection of the event stream (job.*, resume.*,
checkpoint.registered): ``ckpt-ha registry rebuild`` clears this key space and replays the
stream into it (`clear`, and an owner built with ``replaying=True``). A lease is transient.

Lifetimes. A start record has no expiry while its run goes on: a job may train for months
without a progress report (progress is optional), and its next ``job.failed`` needs the start
to be decided. The run's end (``job.succeeded``, or an escalation: automatic restores stop)
gives the run's start records ``ttl_s`` (`end_run`); a run whose end was never reported keeps
them (about a kilobyte per attempt). Everything else expires after ``ttl_s`` without a write to
the key: the trajectory and last points are refreshed by every progress report, a plan by each
report of its resumed attempt until the verdict, failures, restarts and storage errors only
count within the stop conditions' windows. A watch has no expiry while its attempt runs (a
silent attempt is what it is for); an ended one (a tombstone) expires after ``ttl_s``. The R15
pins a decision implies are owned by `ckpt_ha.registry.pins` (no expiry) and written in the
decision's transaction through it.
"""

from __future__ import annotations

from ckpt_ha.restore_coordinator.store.attention import AttentionStore
from ckpt_ha.restore_coordinator.store.decisions import DecisionStore
from ckpt_ha.restore_coordinator.store.progress import ProgressStore
from ckpt_ha.restore_coordinator.store.watches import WatchStore

__all__ = ["RedisRestores"]


class RedisRestores(ProgressStore, DecisionStore, WatchStore, AttentionStore):
    """Async Redis adapter for the coordinator's per-job state (see the module doc).

    ``replaying``: for a rebuild from the stream. A replay writes months of events in seconds,
    and Redis's own clock would keep every key it writes: state the live coordinator lost to
    inactivity long ago (trajectories of every job ever run) would come back. So a replaying
    owner sets no expiry while it writes; it notes when each key would expire (the replayed
    event's time plus ``ttl_s``, `replay_to` moves that clock), deletes a key as soon as the
    replay passes that time (as Redis did live: a later write starts the key afresh), and
    `finish_replay` gives every key left its expiry."""
