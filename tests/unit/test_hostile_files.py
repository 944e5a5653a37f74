"""Hostile commit evidence (`tests.support.hostile`): every reader answers with a verdict, the
writer-watcher keeps scanning every other folder, and ``ckpt-ha verify`` prints one verdict.

Before the readers were bounded, a 5,000-digit number in any of these files raised a plain
ValueError: the watcher's whole scan aborted (blind for every job) and ``ckpt-ha verify`` ended
in a traceback.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointWritingV1
from ckpt_ha.formats import limits, verify_path
from ckpt_ha.formats.report import Verdict
from ckpt_ha.storage import FsStore
from ckpt_ha.writer_watcher.handlers import Watcher
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.watcher_state import WatchStateBackend
from tests.support.hostile import CASES, build_case, write_native

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_gives_a_verdict_on_hostile_evidence(tmp_path: Path, case: str) -> None:
    started = time.process_time()  # CPU, not wall time: a loaded machine must not fail it
    report = verify_path(build_case(tmp_path, case))
    assert report.verdict in {Verdict.CORRUPT, Verdict.INCOMPLETE}, (case, report.reasons)
    assert report.reasons
    assert len(report.reasons) <= limits.MAX_REASONS + 1
    assert all(len(r) <= limits.MAX_REASON_CHARS for r in report.reasons)
    assert time.process_time() - started < 10, "a verdict, without unbounded work"


async def test_one_hostile_folder_never_blinds_the_watcher_to_the_others(tmp_path: Path) -> None:
    """Every hostile case in one job's folders, two good checkpoints in another job's: one
    scan announces both good ones, and every hostile folder gets a decision or a note."""
    root = tmp_path / "storage"
    for case in CASES:
        build_case(root / "job-evil", case)
    write_native(root / "job-good" / "step-1", step=1)
    write_native(root / "job-good" / "step-2", step=2)
    publisher = RecordingPublisher()
    store = FsStore(root)
    now = T0

    def clock() -> datetime:
        return now

    state = WatchStateBackend().open(store.uri("x"))
    watcher = Watcher(store, publisher, clock, timedelta(minutes=5), state, InMemoryRegistry())
    await watcher.scan_once()
    now += timedelta(seconds=30)
    await watcher.scan_once()  # the second scan announces the writes still waiting
    committed = {
        e.data.uri.rsplit("/", 1)[-1]: e.data
        for e in publisher.events
        if isinstance(e.data, CheckpointCommittedV1) and e.data.job_id == "job-good"
    }
    assert sorted(committed) == ["step-1", "step-2"]
    assert (committed["step-1"].step, committed["step-2"].step) == (1, 2)
    # Every hostile folder is tracked (committed for verification to judge, or awaited).
    assert watcher.state is not None
    tracked = {f.split("/", 1)[1] for f in watcher.state.folders if f.startswith("job-evil/")}
    assert tracked == set(CASES)
    evil = [e.data for e in publisher.events if e.data.uri.split("/")[-2] == "job-evil"]
    assert all(isinstance(d, CheckpointCommittedV1 | CheckpointWritingV1) for d in evil)


def test_a_state_index_with_a_huge_number_is_unreadable_not_a_crash() -> None:
    """`sdk.load` decodes the state index a checkpoint's manifest vouches for: a writer that
    put a 5,000-digit number in it gets `UnreadableState`, like any other bad index."""
    from ckpt_ha.sdk import state

    index = f'{{"format": "{state.INDEX_FORMAT}", "root": {"9" * 5000}}}'.encode()
    with pytest.raises(state.UnreadableState, match="not valid JSON"):
        state.decode(index, lambda path: b"")
