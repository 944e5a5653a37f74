"""The intake services' handlers against the port fakes: writer-watcher, integrity-checker and
registrar wired to one in-memory registry, one recording publisher and a real FsStore on
tmp_path. No broker, no Redis: what is decided, persisted and published, end to end."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointCorruptV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointQuarantinedV1,
    CheckpointRegisteredV1,
    CheckpointState,
    CheckpointVerifiedV1,
    CheckpointWriteFailedV1,
    FailureSide,
)
from ckpt_ha.core.lifecycle import IllegalTransition
from ckpt_ha.formats import native
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.integrity_checker.handlers import IntegrityHandlers
from ckpt_ha.integrity_checker.scrub import Scrubber
from ckpt_ha.registrar.handlers import RegistrarHandlers
from ckpt_ha.storage import FsStore, key_for_uri
from ckpt_ha.telemetry.metrics import ScrubMetrics, ServiceMetrics
from ckpt_ha.writer_watcher.handlers import Watcher
from ckpt_ha.writer_watcher.ports import WatchStateUnavailable
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
            key_of=partial(key_for_uri, self.store),
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


async def test_a_commit_heard_twice_before_its_verdict_is_verified_once(intake: Intake) -> None:
    cid = write(intake.store)
    event = committed_event(intake.store, cid)
    await intake.registrar.on_checkpoint_events([event])
    await intake.checker.on_committed(event)  # type: ignore[arg-type]
    await intake.checker.on_committed(event)  # type: ignore[arg-type]
    # Same cause, same follow-up ids: the publisher keeps one verdict.
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
    assert await intake.watcher.scan_once() == 2
    corrupt = intake.publisher.of_type("checkpoint.corrupt")
    assert [e.data.side for e in corrupt] == [FailureSide.INFRASTRUCTURE]  # type: ignore[attr-defined]
    await intake.deliver()
    assert await intake.state(cid) is S.QUARANTINED


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
