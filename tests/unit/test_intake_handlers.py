"""The intake services' handlers against the port fakes: writer-watcher, integrity-checker and
registrar wired to one in-memory registry, one recording publisher and a real FsStore on
tmp_path. No broker, no Redis: what is decided, persisted and published, end to end."""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointCorruptV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointQuarantinedV1,
    CheckpointRegisteredV1,
    CheckpointReleasedV1,
    CheckpointState,
    CheckpointVerifiedV1,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
    FailureSide,
)
from ckpt_ha.core.errors import DependencyNotReady
from ckpt_ha.core.lifecycle import IllegalTransition
from ckpt_ha.core.locations import LocationNotOwned
from ckpt_ha.formats import native
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.integrity_checker.handlers import IntegrityHandlers
from ckpt_ha.integrity_checker.metrics import ScrubMetrics
from ckpt_ha.integrity_checker.reconcile import Reconciler, ReconcileRound
from ckpt_ha.integrity_checker.scrub import Scrubber
from ckpt_ha.registrar.handlers import RegistrarHandlers
from ckpt_ha.storage import FsStore, keys_in
from ckpt_ha.telemetry.metrics import ReconcileMetrics, ServiceMetrics
from ckpt_ha.writer_watcher.handlers import Redrive, Watcher
from ckpt_ha.writer_watcher.ports import WatchStateUnavailable
from ckpt_ha.writer_watcher.removals import REMOVAL_GRACE
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.watcher_state import WatchStateBackend

S = CheckpointState
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STALL = timedelta(minutes=5)


@dataclass
class Intake:
    """The three services' handlers on shared fakes, and a clock the test moves."""

    store: FsStore
    registry: InMemoryRegistry = field(default_factory=InMemoryRegistry)
    publisher: RecordingPublisher = field(default_factory=RecordingPublisher)
    watch_state: WatchStateBackend = field(default_factory=WatchStateBackend)
    now: datetime = T0
    delivered: int = 0
    """How many published events `deliver` has handed to the consumers so far."""

    def clock(self) -> datetime:
        return self.now

    def __post_init__(self) -> None:
        self.registrar = RegistrarHandlers(
            self.registry,
            self.publisher,
            ServiceMetrics("registrar", CollectorRegistry()),
            self.clock,
            key_of=keys_in(self.store),
        )
        self.checker = IntegrityHandlers(
            self.store, self.publisher, self.clock, "xxh3_64", self.registry
        )
        self.watcher = self.new_watcher()

    def new_watcher(self) -> Watcher:
        """A (re)started watcher: fresh memory, the same persisted watch state."""
        state = self.watch_state.open(self.store.uri("x"))
        return Watcher(self.store, self.publisher, self.clock, STALL, state, self.registry)

    def scrubber(self) -> Scrubber:
        metrics = ScrubMetrics(ServiceMetrics("integrity-checker", CollectorRegistry()))
        return Scrubber(self.store, self.registry, self.publisher, self.clock, "xxh3_64", metrics)

    async def deliver(self) -> list[BaseException | None]:
        """Hand every event published since the last call to its consumers, as the broker would
        (the registrar projects every checkpoint event; the checker verifies commits), until
        nothing new is published. Returns the registrar's outcomes."""
        outcomes: list[BaseException | None] = []
        while self.delivered < len(self.publisher.events):
            event = self.publisher.events[self.delivered]
            self.delivered += 1
            outcomes += await self.registrar.on_checkpoint_events([event])
            if isinstance(event.data, CheckpointCommittedV1):
                await self.checker.on_committed(event)  # type: ignore[arg-type]
        return outcomes

    async def state(self, checkpoint_id: str) -> CheckpointState | None:
        record = await self.registry.get(checkpoint_id)
        return record.state if record is not None else None


@pytest.fixture
def intake(tmp_path: Path) -> Intake:
    root = tmp_path / "storage"
    root.mkdir()
    return Intake(FsStore(root))


IDENTITY = CheckpointIdentity(job_id="job-1", run_id="run-7", project="vision", created_at=T0)


def write(store: FsStore, folder: str = "job-1/step-10", step: int = 10) -> str:
    shards = {"rank-0.bin": os.urandom(4096), "rank-1.bin": os.urandom(1024)}
    native.write(store, folder, shards, step=step, created_at=T0, identity=IDENTITY)
    return checkpoint_id_on(store, folder)


def committed_event(store: FsStore, cid: str, folder: str = "job-1/step-10") -> Envelope[EventData]:
    data = CheckpointCommittedV1(
        job_id="job-1", checkpoint_id=cid, uri=store.uri(folder), run_id="run-7", step=10,
        format=CheckpointFormat.NATIVE, identity=IDENTITY,
    )  # fmt: skip
    return build(data, source="sdk", time=T0, key="sdk")


# --- committed → pending → verified → registered -------------------------------------------------


async def test_a_written_checkpoint_is_committed_verified_and_registered(intake: Intake) -> None:
    cid = write(intake.store)
    assert await intake.watcher.scan_once() == 1
    assert intake.publisher.types() == ["checkpoint.committed"]

    assert await intake.deliver() == [None, None, None]
    assert intake.publisher.types() == [
        "checkpoint.committed",
        "checkpoint.verified",
        "checkpoint.registered",
    ]
    record = await intake.registry.get(cid)
    assert record is not None
    assert [h.state for h in record.history] == [S.PENDING_VERIFICATION, S.VALID]
    assert set(record.checksums) == {"rank-0.bin", "rank-1.bin"}
    [registered] = intake.publisher.of_type("checkpoint.registered")
    assert isinstance(registered.data, CheckpointRegisteredV1)
    assert (registered.data.step, registered.data.project, registered.data.tier) == (
        10,
        "vision",
        "exploratory",
    )
    assert registered.data.identity.run_id == "run-7"
    # One trace: every follow-up continues the trace the watcher's first event started.
    assert len({e.traceparent for e in intake.publisher.events}) == 1


async def test_every_transition_is_counted_whether_or_not_it_announces_anything(
    intake: Intake,
) -> None:
    """The commit announces nothing (settled without entering its trace when no span is
    recorded), the verdict announces the registration: both transitions are counted."""
    write(intake.store)
    assert await intake.watcher.scan_once() == 1
    assert await intake.deliver() == [None, None, None]
    text = generate_latest(intake.registrar.metrics.registry).decode()
    for before, after in (("none", "pending_verification"), ("pending_verification", "valid")):
        assert (
            f'ckpt_ha_checkpoint_transitions_total{{from_state="{before}",service="registrar",'
            f'to_state="{after}"}} 1.0'
        ) in text


async def test_the_registrar_announces_the_jobs_chosen_tier(intake: Intake) -> None:
    await intake.registry.declare_tier("job-1", "critical")
    cid = write(intake.store)
    await intake.registrar.on_checkpoint_events([committed_event(intake.store, cid)])
    await intake.checker.on_committed(committed_event(intake.store, cid))  # type: ignore[arg-type]
    await intake.registrar.on_checkpoint_events(intake.publisher.of_type("checkpoint.verified"))
    [registered] = intake.publisher.of_type("checkpoint.registered")
    assert registered.data.tier == "critical"  # type: ignore[attr-defined]


# --- duplicates are no-ops ----------------------------------------------------------------------


async def test_a_redelivered_event_changes_nothing_and_publishes_nothing_new(
    intake: Intake,
) -> None:
    cid = write(intake.store)
    event = committed_event(intake.store, cid)
    await intake.publisher.publish(event)
    await intake.deliver()
    assert await intake.state(cid) is S.VALID
    before, published = intake.registry.snapshot(), list(intake.publisher.events)

    # The registrar hears the commit and the verdict again; the checker hears the commit again.
    assert await intake.registrar.on_checkpoint_events(list(published)) == [None, None, None]
    await intake.checker.on_committed(event)  # type: ignore[arg-type]
    assert intake.registry.snapshot() == before
    assert intake.publisher.events == published


async def test_a_batch_of_commits_settles_each_commit_by_its_own_outcome(intake: Intake) -> None:
    """The checker's consumer hands it fetched batches (`IntegrityHandlers.on_commits`): each
    commit is verified and published as `on_committed` does it, and one it refuses (bytes
    outside the storage root) or that was decided already fails or skips alone."""
    good, bad = write(intake.store), write(intake.store, "job-1/step-20", 20)
    decided = write(intake.store, "job-1/step-30", 30)
    (intake.store.root / "job-1/step-20/rank-1.bin").write_bytes(b"flipped")
    done = committed_event(intake.store, decided, "job-1/step-30")
    await intake.registrar.on_checkpoint_events([done])
    await intake.checker.on_committed(done)  # type: ignore[arg-type]
    await intake.registrar.on_checkpoint_events(intake.publisher.of_type("checkpoint.verified"))
    assert await intake.state(decided) is S.VALID
    intake.publisher.events.clear()
    elsewhere = committed_event(intake.store, "c-x")
    outside = elsewhere.model_copy(
        update={"data": elsewhere.data.model_copy(update={"uri": "file:///elsewhere/job-1/x"})}
    )
    batch = [
        committed_event(intake.store, good),
        outside,
        committed_event(intake.store, bad, "job-1/step-20"),
        done,
    ]
    results = await intake.checker.on_commits(batch)
    assert [type(r).__name__ for r in results] == [
        "NoneType",
        "OutsideStorageRoot",
        "NoneType",
        "NoneType",
    ]
    verdicts = [(e.data.checkpoint_id, e.event_type) for e in intake.publisher.events]  # type: ignore[attr-defined]
    assert sorted(verdicts) == sorted(
        [
            (good, "checkpoint.verified"),
            (bad, "checkpoint.corrupt"),
            (bad, "checkpoint.quarantined"),
        ]
    )


async def test_a_commit_heard_twice_before_its_verdict_is_verified_once(intake: Intake) -> None:
    cid = write(intake.store)
    event = committed_event(intake.store, cid)
    await intake.registrar.on_checkpoint_events([event])
    await intake.checker.on_committed(event)  # type: ignore[arg-type]
    await intake.checker.on_committed(event)  # type: ignore[arg-type]
    # Same cause, same follow-up ids: the publisher keeps one verdict.
    assert intake.publisher.types() == ["checkpoint.verified"]


async def test_one_commit_announced_twice_and_verified_by_two_replicas_has_one_verdict(
    intake: Intake,
) -> None:
    """The writer and the watcher both announce a commit (two event ids); two checker replicas
    each take one announcement before the registry holds a verdict: one verdict event."""
    cid = write(intake.store)
    by_writer = committed_event(intake.store, cid)
    by_watcher = build(by_writer.data, source="ckpt-ha/writer-watcher", time=T0, key="watcher")
    assert by_writer.id != by_watcher.id
    await intake.registrar.on_checkpoint_events([by_writer, by_watcher])
    other = IntegrityHandlers(
        intake.store, intake.publisher, intake.clock, "xxh3_64", intake.registry
    )
    await asyncio.gather(
        intake.checker.on_committed(by_writer),  # type: ignore[arg-type]
        other.on_committed(by_watcher),  # type: ignore[arg-type]
    )
    assert intake.publisher.types() == ["checkpoint.verified"]


# --- a corrupt checkpoint → corrupt + quarantined ------------------------------------------------


async def test_a_corrupt_checkpoint_is_condemned_and_its_bytes_moved_aside(
    intake: Intake,
) -> None:
    cid = write(intake.store)
    shard = intake.store.root / "job-1" / "step-10" / "rank-1.bin"
    shard.write_bytes(os.urandom(1024))  # same size, other bytes: only the checksum tells
    event = committed_event(intake.store, cid)
    await intake.publisher.publish(event)
    outcomes = await intake.deliver()

    assert outcomes == [None, None, None]
    assert intake.publisher.types() == [
        "checkpoint.committed",
        "checkpoint.corrupt",
        "checkpoint.quarantined",
    ]
    corrupt, quarantined = (e.data for e in intake.publisher.events[1:])
    assert isinstance(corrupt, CheckpointCorruptV1)
    assert corrupt.side is FailureSide.JOB
    assert "rank-1.bin" in corrupt.reason
    assert isinstance(quarantined, CheckpointQuarantinedV1)
    assert quarantined.quarantine_uri is not None
    assert not shard.exists()  # moved under quarantine/, never offered again
    record = await intake.registry.get(cid)
    assert record is not None
    assert (record.state, record.quarantine_uri) == (S.QUARANTINED, quarantined.quarantine_uri)
    assert await intake.registry.latest_valid("job-1") is None


async def test_an_illegal_transition_is_refused_and_reported_as_a_conflict(
    intake: Intake,
) -> None:
    cid = write(intake.store)
    failed = build(
        CheckpointWriteFailedV1(
            job_id="job-1", checkpoint_id=cid, uri=intake.store.uri("job-1/step-10"),
            reason="rank died", side=FailureSide.JOB,
        ),
        source="test", time=T0, key="x",
    )  # fmt: skip
    await intake.registrar.on_checkpoint_events([committed_event(intake.store, cid), failed])
    await intake.checker.on_committed(committed_event(intake.store, cid))  # type: ignore[arg-type]
    assert intake.publisher.types() == []  # already decided (write failed): not verified again

    verdict = CheckpointVerifiedV1(
        job_id="job-1", checkpoint_id=cid, uri=intake.store.uri("job-1/step-10"), checks=("x",)
    )
    late = build(verdict, source="test/checker", time=T0, key="late")
    [outcome] = await intake.registrar.on_checkpoint_events([late])
    assert isinstance(outcome, IllegalTransition)
    assert intake.publisher.types() == ["checkpoint.conflict"]
    assert await intake.state(cid) is S.WRITE_FAILED


async def test_a_batch_settles_each_event_on_its_own(intake: Intake) -> None:
    """One fetched batch: a commit, a commit at a location its job does not own (refused before
    the registry), the first commit again, and a verdict before its commit. Each gets its own
    outcome; the refused and the waiting one take nothing from their neighbours."""
    cid = write(intake.store)
    first = committed_event(intake.store, cid)
    foreign = build(
        CheckpointCommittedV1(
            job_id="job-1", checkpoint_id="foreign", uri=intake.store.uri("job-2/step-10"),
            run_id="run-7", step=10, format=CheckpointFormat.NATIVE,
        ),
        source="sdk", time=T0, key="foreign",
    )  # fmt: skip
    early = build(
        CheckpointVerifiedV1(
            job_id="job-1", checkpoint_id="ghost", uri=intake.store.uri("job-1/step-11"),
            checks=("x",),
        ),
        source="test/checker", time=T0, key="early",
    )  # fmt: skip
    outcomes = await intake.registrar.on_checkpoint_events([first, foreign, first, early])
    assert outcomes[0] is None
    assert outcomes[2] is None
    assert isinstance(outcomes[1], LocationNotOwned)
    assert isinstance(outcomes[3], DependencyNotReady)
    assert await intake.state(cid) is S.PENDING_VERIFICATION
    assert await intake.state("foreign") is None
    assert await intake.state("ghost") is None
    assert intake.publisher.types() == ["checkpoint.conflict"]  # the refused location, once


# --- the watcher: commit, stall, lost files, restart ---------------------------------------------


async def test_an_incomplete_write_that_stalls_is_a_failed_write(intake: Intake) -> None:
    intake.store.put("job-1/step-20/rank-0.bin", b"partial")
    assert await intake.watcher.scan_once() == 0  # tracked: announced once its id is settled
    assert await intake.watcher.scan_once() == 1
    assert intake.publisher.types() == ["checkpoint.writing"]
    intake.now = T0 + STALL - timedelta(seconds=1)
    assert await intake.watcher.scan_once() == 0
    intake.now = T0 + STALL + timedelta(seconds=1)
    assert await intake.watcher.scan_once() == 1
    [failed] = intake.publisher.of_type("checkpoint.write_failed")
    assert isinstance(failed.data, CheckpointWriteFailedV1)
    assert failed.data.side is FailureSide.JOB
    assert "stalled" in failed.data.reason
    await intake.deliver()
    assert await intake.state(failed.data.checkpoint_id) is S.WRITE_FAILED


async def test_a_restarted_watcher_announces_nothing_twice(intake: Intake) -> None:
    write(intake.store)
    assert await intake.watcher.scan_once() == 1
    assert await intake.watcher.scan_once() == 0
    restarted = intake.new_watcher()
    assert await restarted.scan_once() == 0
    assert intake.publisher.types() == ["checkpoint.committed"]


async def test_files_lost_before_verification_fail_the_write(intake: Intake) -> None:
    cid = write(intake.store)
    await intake.watcher.scan_once()
    await intake.registrar.on_checkpoint_events(list(intake.publisher.events))  # pending
    # Not the first file written: the checkpoint id comes from the oldest file's time.
    (intake.store.root / "job-1" / "step-10" / "rank-1.bin").unlink()
    assert await intake.watcher.scan_once() == 1
    [failed] = intake.publisher.of_type("checkpoint.write_failed")
    assert failed.data.checkpoint_id == cid  # type: ignore[attr-defined]
    assert "files missing after commit" in failed.data.reason  # type: ignore[attr-defined]


async def test_files_lost_after_verification_quarantine_a_valid_checkpoint(
    intake: Intake,
) -> None:
    cid = write(intake.store)
    await intake.watcher.scan_once()
    await intake.deliver()
    assert await intake.state(cid) is S.VALID
    # Not the first file written: the checkpoint id comes from the oldest file's time.
    (intake.store.root / "job-1" / "step-10" / "rank-1.bin").unlink()
    assert await intake.watcher.scan_once() == 0  # maybe its writer removing it: wait
    intake.now = T0 + REMOVAL_GRACE
    assert await intake.watcher.scan_once() == 2
    corrupt = intake.publisher.of_type("checkpoint.corrupt")
    assert [e.data.side for e in corrupt] == [FailureSide.INFRASTRUCTURE]  # type: ignore[attr-defined]
    await intake.deliver()
    assert await intake.state(cid) is S.QUARANTINED


async def test_a_valid_checkpoint_its_writer_removed_is_deleted_by_the_job_never_corrupt(
    intake: Intake,
) -> None:
    """A framework's rotation (``save_total_limit``): the folder goes as a whole, file by file,
    once a newer checkpoint of the job is written (it stays)."""
    cid = write(intake.store)
    write(intake.store, "job-1/step-20", step=20)
    assert await intake.watcher.scan_once() == 2
    await intake.deliver()
    assert await intake.state(cid) is S.VALID
    folder = intake.store.root / "job-1" / "step-10"
    (folder / "rank-1.bin").unlink()  # a scan lands half-way through the removal
    assert await intake.watcher.scan_once() == 0
    shutil.rmtree(folder)
    intake.now = T0 + timedelta(seconds=5)
    assert await intake.watcher.scan_once() == 0
    intake.now = T0 + REMOVAL_GRACE
    assert await intake.watcher.scan_once() == 2
    await intake.deliver()
    assert intake.publisher.of_type("checkpoint.corrupt") == []
    assert intake.publisher.of_type("checkpoint.quarantined") == []
    record = await intake.registry.get(cid)
    assert record is not None
    assert record.state is S.DELETED
    assert record.tombstone is not None
    assert (record.tombstone.actor, record.tombstone.policy) == ("job:job-1", "writer-rotation")
    assert "deleted by its writer" in record.tombstone.reason


async def test_a_scrub_leaves_a_folder_gone_as_a_whole_to_the_watcher(intake: Intake) -> None:
    """Its writer's rotation (a newer one of the job stays), seen by a scrub before the watcher
    decided: no page for it."""
    cid = write(intake.store)
    write(intake.store, "job-1/step-20", step=20)
    await intake.watcher.scan_once()
    await intake.deliver()
    shutil.rmtree(intake.store.root / "job-1" / "step-10")
    scrubber = intake.scrubber()
    done = await scrubber.scrub_once()
    assert (done.scrubbed, done.corrupt) == (1, 0)  # step-20 read, step-10 skipped
    assert intake.publisher.of_type("checkpoint.corrupt") == []
    assert await intake.state(cid) is S.VALID  # until the watcher records its removal
    # Still valid and gone a pass later: the watcher did not record a rotation (the newer one
    # came after it went, from a job restored after a loss): a loss, condemned.
    done = await scrubber.scrub_once()
    assert (done.scrubbed, done.corrupt) == (2, 1)
    await intake.deliver()
    assert await intake.state(cid) is S.QUARANTINED


async def test_the_jobs_newest_gone_too_is_a_loss_the_scrub_condemns_never_a_deletion(
    intake: Intake,
) -> None:
    """A wiped disk or a deleted prefix: no rotation removes a job's newest checkpoint."""
    old = write(intake.store)
    new = write(intake.store, "job-1/step-20", step=20)
    await intake.watcher.scan_once()
    await intake.deliver()
    shutil.rmtree(intake.store.root / "job-1")
    assert await intake.watcher.scan_once() == 0
    intake.now = T0 + REMOVAL_GRACE
    assert await intake.watcher.scan_once() == 0  # no tombstone: left to the scrub
    assert intake.publisher.of_type("checkpoint.deleted") == []
    done = await intake.scrubber().scrub_once()
    assert (done.scrubbed, done.corrupt) == (2, 2)
    await intake.deliver()
    assert [await intake.state(cid) for cid in (old, new)] == [S.QUARANTINED, S.QUARANTINED]


async def test_a_watch_state_outage_decides_and_publishes_nothing(intake: Intake) -> None:
    write(intake.store)
    intake.watch_state.down = True
    with pytest.raises(WatchStateUnavailable):
        await intake.watcher.scan_once()
    assert intake.publisher.events == []
    intake.watch_state.down = False
    assert await intake.watcher.scan_once() == 1


# --- the scrub ----------------------------------------------------------------------------------


async def test_a_scrub_condemns_a_valid_checkpoint_whose_bytes_changed(intake: Intake) -> None:
    cid = write(intake.store)
    await intake.watcher.scan_once()
    await intake.deliver()
    scrubber = intake.scrubber()
    first = await scrubber.scrub_once()
    assert (first.scrubbed, first.corrupt, first.complete) == (1, 0, True)

    shard = intake.store.root / "job-1" / "step-10" / "rank-0.bin"
    shard.write_bytes(os.urandom(4096))
    assert (await scrubber.scrub_once()).corrupt == 1
    [corrupt] = intake.publisher.of_type("checkpoint.corrupt")
    assert corrupt.data.side is FailureSide.INFRASTRUCTURE  # type: ignore[attr-defined]
    await intake.deliver()
    assert await intake.state(cid) is S.QUARANTINED
    # Nothing valid is left to scrub; a repeat reports nothing new.
    assert (await scrubber.scrub_once()).scrubbed == 0
    assert len(intake.publisher.of_type("checkpoint.corrupt")) == 1


async def test_a_registry_outage_cuts_a_scrub_round_short(intake: Intake) -> None:
    write(intake.store)
    await intake.watcher.scan_once()
    await intake.deliver()
    intake.registry.down = True
    outage = await intake.scrubber().scrub_once()
    assert (outage.scrubbed, outage.corrupt, outage.complete) == (0, 0, False)


# --- the reconciler: a verdict lost to an outage -------------------------------------------------

VERIFY_DEADLINE = timedelta(minutes=30)


def reconciler(intake: Intake, publisher: RecordingPublisher | None = None) -> Reconciler:
    handlers = IntegrityHandlers(
        intake.store, publisher or intake.publisher, intake.clock, "xxh3_64", intake.registry
    )
    metrics = ReconcileMetrics(ServiceMetrics("integrity-checker", CollectorRegistry()))
    return Reconciler(
        intake.store, intake.registry, handlers, intake.clock, VERIFY_DEADLINE, metrics
    )


async def test_a_commit_whose_verification_was_dead_lettered_is_verified_after_the_deadline(
    intake: Intake,
) -> None:
    cid = write(intake.store)
    commit = committed_event(intake.store, cid)
    await intake.registrar.on_checkpoint_events([commit])  # the checker never got it
    rounds = reconciler(intake)
    assert await rounds.reconcile_once() == ReconcileRound(0, 0, complete=True)  # not yet due
    intake.now = T0 + VERIFY_DEADLINE
    assert await rounds.reconcile_once() == ReconcileRound(1, 1, complete=True)
    [verdict] = intake.publisher.of_type("checkpoint.verified")
    # The id the live handler would have given it: the lost verdict and this one are one event.
    live = RecordingPublisher()
    await IntegrityHandlers(
        intake.store, live, intake.clock, "xxh3_64", intake.registry
    ).on_committed(commit)  # type: ignore[arg-type]
    assert [e.id for e in live.events] == [verdict.id]

    # Re-driven twice (the next round comes before the registrar applied it, past JetStream's
    # duplicate window): the registry applies it once.
    again = RecordingPublisher()
    assert (await reconciler(intake, again).reconcile_once()).redriven == 1
    assert [e.id for e in again.events] == [verdict.id]
    outcomes = await intake.registrar.on_checkpoint_events([verdict, again.events[0]])
    assert outcomes == [None, None]
    record = await intake.registry.get(cid)
    assert record is not None
    assert [h.state for h in record.history] == [S.PENDING_VERIFICATION, S.VALID]
    assert await rounds.reconcile_once() == ReconcileRound(0, 0, complete=True)


async def test_a_lost_release_verdict_brings_the_bytes_back_from_quarantine_first(
    intake: Intake,
) -> None:
    cid = write(intake.store)
    shard = intake.store.root / "job-1" / "step-10" / "rank-1.bin"
    good = shard.read_bytes()
    shard.write_bytes(os.urandom(len(good)))
    await intake.publisher.publish(committed_event(intake.store, cid))
    await intake.deliver()
    assert await intake.state(cid) is S.QUARANTINED
    quarantined = intake.store.root / "quarantine" / "job-1" / cid / "rank-1.bin"
    quarantined.write_bytes(good)  # a human repaired it in quarantine, then released it
    record = await intake.registry.get(cid)
    assert record is not None
    release = build(
        CheckpointReleasedV1(
            job_id="job-1", checkpoint_id=cid, uri=record.uri, reason="repaired", actor="ops",
            quarantine_uri=record.quarantine_uri,
        ),
        source="cli", time=T0, key="release",
    )  # fmt: skip
    await intake.registrar.on_checkpoint_events([release])  # the checker's delivery was lost
    intake.now = T0 + VERIFY_DEADLINE
    assert (await reconciler(intake).reconcile_once()).redriven == 1
    await intake.deliver()
    assert await intake.state(cid) is S.VALID
    assert shard.read_bytes() == good  # back where it was written
    assert not quarantined.exists()


async def test_an_outage_cuts_a_reconcile_round_short_and_decides_nothing(
    intake: Intake,
) -> None:
    cid = write(intake.store)
    await intake.registrar.on_checkpoint_events([committed_event(intake.store, cid)])
    intake.now = T0 + VERIFY_DEADLINE
    rounds = reconciler(intake)
    away = intake.store.root.with_name("storage.outage")
    intake.store.root.rename(away)  # storage unmounted
    assert await rounds.reconcile_once() == ReconcileRound(1, 0, complete=False)
    away.rename(intake.store.root)
    intake.registry.down = True
    assert await rounds.reconcile_once() == ReconcileRound(0, 0, complete=False)
    assert intake.publisher.events == []
    intake.registry.down = False
    assert await rounds.reconcile_once() == ReconcileRound(1, 1, complete=True)
    await intake.deliver()
    assert await intake.state(cid) is S.VALID


# --- the reconciler: writes the registry still holds as writing ----------------------------------

WRITING_DEADLINE = timedelta(minutes=30)


def redriving_watcher(intake: Intake, metrics: ReconcileMetrics) -> Watcher:
    state = intake.watch_state.open(intake.store.uri("x"))
    redrive = Redrive(WRITING_DEADLINE, timedelta(minutes=5), metrics)
    return Watcher(
        intake.store, intake.publisher, intake.clock, STALL, state, intake.registry, redrive
    )


def stuck_gauge(metrics: ServiceMetrics) -> float | None:
    labels = {"service": "writer-watcher", "state": "writing"}
    return metrics.registry.get_sample_value("ckpt_ha_stuck_checkpoints", labels)


async def test_writes_the_registry_still_holds_as_writing_are_re_driven_once(
    intake: Intake,
) -> None:
    """A commit the registrar lost (dead-lettered while Redis was down) is announced again
    under its own id; a write the SDK announced and no folder holds any more is failed."""
    service = ServiceMetrics("writer-watcher", CollectorRegistry())
    watcher = redriving_watcher(intake, ReconcileMetrics(service))
    cid = write(intake.store)
    await watcher.scan_once()
    [committed] = intake.publisher.of_type("checkpoint.committed")
    uri = intake.store.uri("job-1/step-10")
    sdk = [
        build(
            CheckpointWritingV1(
                job_id="job-1", checkpoint_id=c, uri=u, run_id="run-7",
                format=CheckpointFormat.NATIVE,
            ),
            source="sdk", time=T0, key="sdk",
        )
        for c, u in ((cid, uri), ("job-1-gone", intake.store.uri("job-1/step-20")))
    ]  # fmt: skip
    assert await intake.registrar.on_checkpoint_events(sdk) == [None, None]  # not the commit
    intake.now = T0 + WRITING_DEADLINE - timedelta(seconds=1)
    watcher.publisher = again = RecordingPublisher()  # past JetStream's duplicate window
    await watcher.scan_once()  # a round is due: the first was at T0
    assert again.events == []  # not overdue yet
    assert stuck_gauge(service) == 0.0

    intake.now = T0 + WRITING_DEADLINE + timedelta(minutes=5)  # the next round
    await watcher.scan_once()
    assert sorted(e.event_type for e in again.events) == [
        "checkpoint.committed", "checkpoint.write_failed",
    ]  # fmt: skip
    assert stuck_gauge(service) == 2.0
    [redriven] = again.of_type("checkpoint.committed")
    assert redriven.id == committed.id  # the lost announcement's id: one fact
    [failed] = again.of_type("checkpoint.write_failed")
    assert failed.data.reason.startswith("write never completed")  # type: ignore[attr-defined]
    # Applied with a late replay of the lost original too: one transition each.
    outcomes = await intake.registrar.on_checkpoint_events([*again.events, committed])
    assert outcomes == [None, None, None]
    record = await intake.registry.get(cid)
    assert record is not None
    assert [h.state for h in record.history] == [S.WRITING, S.PENDING_VERIFICATION]
    assert await intake.state("job-1-gone") is S.WRITE_FAILED

    intake.now += timedelta(minutes=10)  # the next round: nothing is left writing
    again.events.clear()
    await watcher.scan_once()
    assert again.events == []
    assert stuck_gauge(service) == 0.0
