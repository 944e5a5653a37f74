"""The pure parts of the operations layer (`ckpt_ha.ops`): interval inputs measured from
records, project summaries, what an audit shows, polling, operator events, offline verdicts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_ha.contracts.checkpoint import (
    CheckpointFormat,
    CheckpointQuarantinedV1,
    CheckpointState,
    CopyState,
)
from ckpt_ha.core.copies import CopyRecord
from ckpt_ha.core.records import CheckpointRecord, HistoryEntry
from ckpt_ha.formats import native
from ckpt_ha.ops import audit, manual, offline, owners, policy
from ckpt_ha.ops.errors import NothingToMeasure
from ckpt_ha.ops.reconcile import Reconciliation, UnknownObject, copy_locations
from ckpt_ha.storage import FsStore
from tests.support.fakes.publisher import RecordingPublisher

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def entry(state: CheckpointState, when: datetime, event_type: str = "x") -> HistoryEntry:
    return HistoryEntry(
        state=state, at=when, event_type=event_type, event_id=f"{event_type}@{when}", actor="svc"
    )


def record(
    ckpt: str,
    state: CheckpointState = CheckpointState.VALID,
    history: tuple[HistoryEntry, ...] = (),
    step: int | None = None,
    total_bytes: int | None = None,
) -> CheckpointRecord:
    return CheckpointRecord(
        checkpoint_id=ckpt, job_id="j", uri=f"file:///x/{ckpt}", state=state, created_at=T0,
        updated_at=T0, history=history, step=step, run_id="run-1", total_bytes=total_bytes,
        format=CheckpointFormat.NATIVE,
    )  # fmt: skip


def written(ckpt: str, start: float, write_s: float, size: int = 1000) -> CheckpointRecord:
    return record(
        ckpt,
        history=(
            entry(CheckpointState.WRITING, at(start)),
            entry(CheckpointState.PENDING_VERIFICATION, at(start + write_s)),
            entry(CheckpointState.VALID, at(start + write_s + 1)),
        ),
        total_bytes=size,
    )


# --- policy: the advisor's inputs ---------------------------------------------------------------


def test_nothing_to_measure_without_records_or_write_times() -> None:
    with pytest.raises(NothingToMeasure, match="no checkpoints registered for job j"):
        policy.measure("j", [], [], policy.Given())
    with pytest.raises(NothingToMeasure, match="pass --write-seconds"):
        policy.measure("j", [record("c1")], [], policy.Given())
    # A given write time needs no measured one.
    inputs, _ = policy.measure("j", [record("c1")], [], policy.Given(write_s=30.0))
    assert inputs.write_s == 30.0


def test_inputs_are_measured_from_history_and_the_failure_log() -> None:
    # Writes of 20 s, started every 620 s: the compute interval is 600 s.
    records = [written(f"c{i}", start=620.0 * i, write_s=20.0, size=4096) for i in range(4)]
    prior = 3600.0
    inputs, notes = policy.measure(
        "j", records, [at(1000.0)], policy.Given(prior_mtbf_s=prior, keep=3)
    )
    assert inputs.write_s == pytest.approx(20.0)
    assert inputs.current_s == pytest.approx(600.0)
    assert inputs.checkpoint_bytes == 4096
    # One failure over the span first start .. last commit, plus the prior worth one failure.
    span = 620.0 * 3 + 20.0
    assert inputs.mtbf_s == pytest.approx((span + prior) / 2)
    assert inputs.restart_s == 0.0
    assert inputs.keep == 3
    assert any(n.startswith("write_seconds: measured") for n in notes)
    assert any("1 failure(s)" in n and "coord:failures:j" in n for n in notes)
    assert "restart time not measured: assumed 0 (pass --restart-seconds)" in notes


def test_every_given_value_overrides_the_measured_one() -> None:
    records = [written(f"c{i}", start=620.0 * i, write_s=20.0) for i in range(3)]
    given = policy.Given(
        write_s=5.0, mtbf_s=7200.0, restart_s=60.0, current_s=100.0, checkpoint_bytes=1.0
    )
    inputs, notes = policy.measure("j", records, [at(10.0)], given)
    assert (inputs.write_s, inputs.mtbf_s, inputs.restart_s) == (5.0, 7200.0, 60.0)
    assert (inputs.current_s, inputs.checkpoint_bytes) == (100.0, 1.0)
    assert notes == []
    assert inputs.advise().write_s == 5.0


def test_given_only_needs_write_time_and_mtbf() -> None:
    with pytest.raises(ValueError, match="must be given"):
        policy.given_only(policy.Given(write_s=1.0))
    inputs = policy.given_only(policy.Given(write_s=1.0, mtbf_s=3600.0))
    assert (inputs.restart_s, inputs.current_s, inputs.keep) == (0.0, None, None)


def test_a_record_without_a_writing_entry_starts_at_its_identity_time() -> None:
    from ckpt_ha.contracts.checkpoint import CheckpointIdentity

    committed = entry(CheckpointState.PENDING_VERIFICATION, at(50.0))
    r = record("c1", history=(committed,)).model_copy(
        update={"identity": CheckpointIdentity(job_id="j", run_id="run-1", created_at=at(10.0))}
    )
    times = policy.checkpoint_times(r)
    assert (times.started, times.committed) == (at(10.0), at(50.0))


# --- owners, audit ------------------------------------------------------------------------------


def test_a_project_job_counts_states_and_names_its_newest_valid_checkpoint() -> None:
    records = [
        record("c3", CheckpointState.CORRUPT, step=300),
        record("c2", CheckpointState.VALID, step=200),
        record("c1", CheckpointState.VALID, step=100),
        record("c0", CheckpointState.DELETED, step=0),
    ]
    job = owners.summarise("j", "standard", records)
    assert job.checkpoints == {"corrupt": 1, "valid": 2, "deleted": 1}
    assert job.latest_valid == "c2"
    assert job.to_json() == {
        "job": "j", "tier": "standard", "checkpoints": job.checkpoints, "latest_valid": "c2"
    }  # fmt: skip
    assert owners.summarise("j", "standard", records[:1]).latest_valid is None


def test_the_audit_shows_only_what_people_and_retention_did() -> None:
    pinned = entry(CheckpointState.VALID, at(2), "checkpoint.pinned")
    plain = record("c1", history=(entry(CheckpointState.VALID, at(1), "checkpoint.verified"),))
    kept = record("c2", history=(*plain.history, pinned))
    assert audit.audited([plain, kept]) == [kept]
    assert audit.events(kept) == [pinned]


# --- operator events ----------------------------------------------------------------------------


async def test_until_returns_the_first_value_or_none_when_time_runs_out() -> None:
    calls: list[int] = []

    async def third() -> str | None:
        calls.append(1)
        return "found" if len(calls) == 3 else None

    assert await manual.until(third, timeout_s=1.0, poll_s=0.01) == "found"
    assert len(calls) == 3

    async def never() -> str | None:
        return None

    assert await manual.until(never, timeout_s=0.03, poll_s=0.01) is None


async def test_operator_events_are_new_facts_in_the_checkpoints_trace() -> None:
    publisher = RecordingPublisher()
    traced = record("c1").model_copy(
        update={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
    )
    data = CheckpointQuarantinedV1(
        job_id="j", checkpoint_id="c1", uri=traced.uri, reason="r", actor="alice"
    )
    keys = iter(["k1", "k2"])
    ids = await manual.publish(
        publisher, [data, data], now=T0, record=traced, key=lambda: next(keys)
    )
    assert ids == [e.id for e in publisher.events]
    assert len(set(ids)) == 2, "the same action twice is two facts"
    assert all(e.traceparent == traced.traceparent for e in publisher.events)
    assert all(e.source == manual.SOURCE and e.time == T0 for e in publisher.events)
    [untraced] = await manual.publish(RecordingPublisher(), [data], now=T0)
    assert untraced not in ids


# --- reconcile, offline -------------------------------------------------------------------------


def test_an_unknown_object_says_deleted_only_once_it_is() -> None:
    obj = UnknownObject(key="a/b", uri="file:///s/a/b", size=3, mtime=T0, old_enough=True)
    assert "deleted" not in obj.to_json()
    assert not Reconciliation([obj], 0).clean
    obj.deleted = True
    assert obj.to_json()["deleted"] is True
    assert Reconciliation([obj], 1).clean
    assert Reconciliation([], 0).clean


def test_a_replica_knows_the_live_copies_of_live_checkpoints_only(tmp_path: Path) -> None:
    """Issue 29: reconcile on a replica root counts a copy as known while the checkpoint and
    the copy live; a copy recorded deleted, and every copy of a deleted checkpoint, are
    leftovers."""
    replica = FsStore(tmp_path)
    copies = {
        replica.uri(f"j/step-{n}"): CopyRecord(
            uri=replica.uri(f"j/step-{n}"), state=state, at=T0, event_id=f"e{n}"
        )
        for n, state in ((1, CopyState.VALID), (2, CopyState.COPYING), (3, CopyState.DELETED))
    }
    copies["s3://elsewhere/j/step-1"] = CopyRecord(
        uri="s3://elsewhere/j/step-1", state=CopyState.VALID, at=T0, event_id="e4"
    )
    record = CheckpointRecord(
        checkpoint_id="c", job_id="j", step=1, uri="file:///primary/j/step-1",
        format=CheckpointFormat.NATIVE, state=CheckpointState.VALID, created_at=T0,
        updated_at=T0, copies=copies,
    )  # fmt: skip
    assert copy_locations(replica, record) == ("j/step-1", "j/step-2")
    gone = record.model_copy(update={"state": CheckpointState.DELETED})
    assert copy_locations(replica, gone) == ()


def test_newest_valid_names_the_newer_folders_it_rejected(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    for step in (100, 200, 300):
        native.write(store, f"step-{step}", {"w.bin": b"x" * 64}, step=step, created_at=T0)
    (tmp_path / "step-300" / "w.bin").write_bytes(b"y" * 10)  # truncated after the manifest
    found = offline.newest_valid(tmp_path)
    assert found.path == str(tmp_path / "step-200")
    assert found.report is not None
    assert found.report.step == 200
    [rejected] = found.rejected
    assert rejected.path == str(tmp_path / "step-300")
    assert rejected.to_json()["step"] == 300
    assert rejected.to_json()["verdict"] != "valid"

    (tmp_path / "step-200" / "w.bin").unlink()
    (tmp_path / "step-100" / "w.bin").unlink()
    none = offline.newest_valid(tmp_path)
    assert none.path is None
    assert none.report is None
    assert [r.path.rsplit("/", 1)[1] for r in none.rejected] == ["step-300", "step-200", "step-100"]
