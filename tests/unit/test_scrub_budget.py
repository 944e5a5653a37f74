"""The scrub's read budget: every byte the scrub reads goes through it in pieces that wait
before they are read, the setting reaches it, and a round that runs out of time at its budget is
continued by the next. Real files on tmp_path; time is a fake the budget's sleep moves (nothing
is timed)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats import native, verify
from ckpt_ha.formats.checksum import checksum
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.formats.report import Verdict
from ckpt_ha.integrity_checker.metrics import ScrubMetrics
from ckpt_ha.integrity_checker.scrub import Scrubber
from ckpt_ha.integrity_checker.settings import IntegrityCheckerSettings
from ckpt_ha.storage import FsStore
from ckpt_ha.storage.read_budget import PIECE, BudgetedStore, ReadBudget
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry

MIB = 2**20
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class FakeTime:
    """One fake time for the budget (monotonic seconds) and the scrub (a UTC clock): sleeping
    moves both, so a round's time limit sees the time its reads waited."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def utc(self) -> datetime:
        return T0 + timedelta(seconds=self.now)


class RecordingBudget(ReadBudget):
    """A real budget that also records every piece asked for."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.pieces: list[int] = []

    def take(self, n: int) -> None:
        self.pieces.append(n)
        super().take(n)


@pytest.fixture
def time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def store(tmp_path: Path) -> FsStore:
    root = tmp_path / "storage"
    root.mkdir()
    return FsStore(root)


def budget(
    time: FakeTime, bytes_per_s: float, burst: int = 2 * MIB, metrics: ScrubMetrics | None = None
) -> RecordingBudget:
    """A budget on the fake time, reporting to ``metrics`` as the service wires it."""
    return RecordingBudget(
        bytes_per_s,
        burst,
        clock=time.monotonic,
        sleep=time.sleep,
        on_read=metrics.read if metrics else None,
        on_wait=metrics.waited if metrics else None,
    )


def scrub_metrics() -> ScrubMetrics:
    return ScrubMetrics(ServiceMetrics("integrity-checker", CollectorRegistry()))


def write_valid(store: FsStore, registry: InMemoryRegistry, folder: str, sizes: list[int]) -> int:
    """A native checkpoint at ``folder`` (``<job>/<name>``) recorded valid with the checksums its
    verification found, as the registrar would have; returns its bytes on storage."""
    job = folder.split("/")[0]
    shards = {f"rank-{i}.bin": os.urandom(size) for i, size in enumerate(sizes)}
    native.write(store, folder, shards, step=10, created_at=T0)
    report = verify(store, folder)
    assert report.ok, report
    total = sum(info.size for info in store.list(f"{folder}/"))
    registry.put(
        CheckpointRecord(
            checkpoint_id=checkpoint_id_on(store, folder),
            job_id=job,
            uri=store.uri(folder),
            state=CheckpointState.VALID,
            checksums=report.checksums,
            total_bytes=total,
            created_at=T0,
            updated_at=T0,
        )
    )
    return total


def scrubber(
    store: FsStore,
    registry: InMemoryRegistry,
    time: FakeTime,
    read_budget: ReadBudget | None,
    metrics: ScrubMetrics | None = None,
) -> Scrubber:
    metrics = metrics or scrub_metrics()
    return Scrubber(
        store, registry, RecordingPublisher(), time.utc, "xxh3_64", metrics, read_budget
    )


# --- the budgeted store --------------------------------------------------------------------------


def test_one_large_read_goes_to_storage_in_pieces_each_waiting_for_its_bytes(
    store: FsStore, time: FakeTime
) -> None:
    data = os.urandom(10 * MIB + 123)
    store.put("job/big.bin", data)
    read_budget = budget(time, bytes_per_s=4 * MIB, burst=2 * MIB)
    assert BudgetedStore(store, read_budget).read_bytes("job/big.bin") == data
    assert max(read_budget.pieces) == PIECE
    assert read_budget.bytes_read == len(data)
    # The first 2 MiB were the burst; the rest waited at 4 MiB/s.
    assert sum(time.sleeps) == pytest.approx((len(data) - 2 * MIB) / (4 * MIB))
    assert read_budget.waited_s == pytest.approx(sum(time.sleeps))


def test_the_checksum_fast_path_is_budgeted_too(store: FsStore, time: FakeTime) -> None:
    data = os.urandom(3 * MIB + 5)
    store.put("job/shard.bin", data)
    read_budget = budget(time, bytes_per_s=MIB, burst=MIB)
    budgeted = BudgetedStore(store, read_budget)
    with budgeted.open_read("job/shard.bin") as stream:
        assert hasattr(stream, "readinto")  # files keep their no-copy path
    assert checksum(budgeted, "job/shard.bin") == checksum(store, "job/shard.bin")
    assert read_budget.bytes_read == len(data)
    assert time.now == pytest.approx((len(data) - MIB) / MIB)


def test_a_short_read_gives_back_what_it_did_not_use(store: FsStore, time: FakeTime) -> None:
    store.put("job/small.bin", b"x" * 1000)
    read_budget = budget(time, bytes_per_s=1000, burst=PIECE)
    with BudgetedStore(store, read_budget).open_read("job/small.bin") as stream:
        assert len(stream.read(PIECE)) == 1000  # asked a whole piece, got 1000 bytes
    assert read_budget.bytes_read == 1000
    assert time.sleeps == []  # only the 1000 bytes read were charged


def test_an_unlimited_budget_counts_and_never_waits(store: FsStore, time: FakeTime) -> None:
    store.put("job/a.bin", os.urandom(3 * MIB))
    seen: list[int] = []
    read_budget = ReadBudget(0, clock=time.monotonic, sleep=time.sleep, on_read=seen.append)
    assert not read_budget.limited
    BudgetedStore(store, read_budget).read_bytes("job/a.bin")
    assert read_budget.bytes_read == sum(seen) == 3 * MIB
    assert time.sleeps == []


def test_verification_through_a_budget_still_refuses_a_link_out_of_the_folder(
    store: FsStore, time: FakeTime
) -> None:
    """`confine` roots the reads at the checkpoint folder under the budget as well."""
    registry = InMemoryRegistry()
    write_valid(store, registry, "job-a/step-1", [4096])
    write_valid(store, registry, "job-b/step-1", [4096])
    shard = store.root / "job-a" / "step-1" / "rank-0.bin"
    shard.unlink()
    shard.symlink_to(store.root / "job-b" / "step-1" / "rank-0.bin")
    report = verify(BudgetedStore(store, budget(time, MIB)), "job-a/step-1")
    assert report.verdict is Verdict.UNSAFE


# --- the scrub reads through it ------------------------------------------------------------------


async def test_every_byte_the_scrub_reads_goes_through_its_budget(
    store: FsStore, time: FakeTime
) -> None:
    registry = InMemoryRegistry()
    on_disk = sum(
        write_valid(store, registry, folder, sizes)
        for folder, sizes in [
            ("job-1/step-10", [3 * MIB + 1, 4096]),
            ("job-1/step-20", [MIB, MIB, 17]),
            ("job-2/step-5", [5 * MIB]),
        ]
    )
    metrics = scrub_metrics()
    read_budget = budget(time, bytes_per_s=2 * MIB, burst=MIB, metrics=metrics)
    scrub = scrubber(store, registry, time, read_budget, metrics)
    result = await scrub.scrub_once()
    assert (result.scrubbed, result.corrupt, result.complete) == (3, 0, True)
    assert read_budget.bytes_read >= on_disk  # every file, manifests included
    assert max(read_budget.pieces) <= PIECE
    assert sum(time.sleeps) == pytest.approx((read_budget.bytes_read - MIB) / (2 * MIB))
    # The metrics count what the budget saw.
    assert metrics.read_bytes.labels(metrics.service)._value.get() == read_budget.bytes_read
    assert metrics.throttled.labels(metrics.service)._value.get() == pytest.approx(
        read_budget.waited_s
    )
    assert metrics.budget.labels(metrics.service)._value.get() == 2 * MIB


async def test_without_a_budget_the_scrub_still_counts_what_it_reads(
    store: FsStore, time: FakeTime
) -> None:
    registry = InMemoryRegistry()
    on_disk = write_valid(store, registry, "job-1/step-10", [MIB])
    scrub = scrubber(store, registry, time, None)
    await scrub.scrub_once()
    assert not scrub.budget.limited
    assert scrub.metrics.read_bytes.labels(scrub.metrics.service)._value.get() >= on_disk
    assert time.sleeps == []


async def test_a_round_out_of_time_at_its_budget_is_continued_by_the_next(
    store: FsStore, time: FakeTime
) -> None:
    registry = InMemoryRegistry()
    for folder in ("job-1/a", "job-1/b", "job-1/c"):
        write_valid(store, registry, folder, [4 * MIB])
    ids = sorted(registry.records)
    # ~4 s of reading per checkpoint at 1 MiB/s: a 6 s round reads two and stops.
    scrub = scrubber(store, registry, time, budget(time, bytes_per_s=MIB, burst=1))
    first = await scrub.scrub_once(limit_s=6)
    assert (first.scrubbed, first.complete, first.paused) == (2, False, True)
    assert first.resume_after == ids[1]
    assert scrub.metrics.paused.labels(scrub.metrics.service)._value.get() == 1
    assert scrub.metrics.last_round.labels(scrub.metrics.service)._value.get() == 0

    second = await scrub.scrub_once(limit_s=6)
    assert (second.scrubbed, second.complete, second.resume_after) == (1, True, None)
    assert scrub.metrics.last_round.labels(scrub.metrics.service)._value.get() > 0
    third = await scrub.scrub_once(limit_s=6)  # a new pass starts from the first checkpoint
    assert (third.scrubbed, third.resume_after) == (2, ids[1])


async def test_an_outage_mid_pass_is_continued_where_it_stopped(
    store: FsStore, time: FakeTime
) -> None:
    registry = InMemoryRegistry()
    for folder in ("job-1/a", "job-1/b"):
        write_valid(store, registry, folder, [1024])
    scrub = scrubber(store, registry, time, None)
    scrub.resume_after = min(registry.records)  # where an earlier round stopped
    registry.down = True
    cut = await scrub.scrub_once()
    assert (cut.complete, cut.paused, cut.resume_after) == (False, False, min(registry.records))
    registry.down = False
    assert (await scrub.scrub_once()).scrubbed == 1  # the one after it, then the pass is done


# --- the setting reaches it ----------------------------------------------------------------------


def test_the_budget_settings_reach_the_scrub_of_the_service(tmp_path: Path) -> None:
    from ckpt_ha.integrity_checker.app import build

    settings = IntegrityCheckerSettings(
        storage_root=str(tmp_path), scrub_bytes_per_s=50 * MIB, scrub_burst_bytes=3 * MIB
    )
    scrub = build(settings).scrubber
    assert (scrub.budget.bytes_per_s, scrub.budget.burst_bytes) == (50 * MIB, 3 * MIB)
    assert scrub.reads.budget is scrub.budget
    assert scrub.metrics.budget.labels(scrub.metrics.service)._value.get() == 50 * MIB


def test_the_default_budget_is_100_mib_per_second_and_0_means_unlimited() -> None:
    assert IntegrityCheckerSettings().scrub_bytes_per_s == 100 * MIB
    assert not ReadBudget(IntegrityCheckerSettings(scrub_bytes_per_s=0).scrub_bytes_per_s).limited
