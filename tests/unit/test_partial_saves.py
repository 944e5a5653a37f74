"""No partial multi-rank native checkpoint (issue 28, deliverable 4): `sdk.save` refuses one
rank's part however the job was launched, and a manifest that cannot hold every rank its
identity declares is never verified valid."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from ckpt_ha import sdk
from ckpt_ha.contracts.checkpoint import CheckpointIdentity, Topology
from ckpt_ha.formats import native, verify
from ckpt_ha.formats.report import Verdict
from ckpt_ha.integrity_checker import domain
from ckpt_ha.sdk import protocol
from ckpt_ha.storage import FsStore

T = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
STATE = {"w": np.arange(4, dtype=np.float32)}


@pytest.fixture
def torchrun(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Plain torchrun's environment, no runner: no $CKPT_HA_JOB."""
    monkeypatch.delenv(protocol.JOB, raising=False)
    monkeypatch.setenv(protocol.WORLD_SIZE, "2")
    return monkeypatch


@pytest.mark.parametrize(("rank", "whole_state"), [(0, False), (1, False), (1, True)])
def test_under_plain_torchrun_a_ranks_part_is_refused(
    torchrun: pytest.MonkeyPatch, tmp_path: Path, rank: int, whole_state: bool
) -> None:
    torchrun.setenv(protocol.RANK, str(rank))
    with pytest.raises(sdk.PartialSave, match=r"WORLD_SIZE/\$RANK say; this is rank") as err:
        sdk.save(str(tmp_path), "job-t", 1, STATE, run_id="r", whole_state=whole_state)
    assert (err.value.rank, err.value.world_size, err.value.source) == (rank, 2, "launcher")
    assert list(tmp_path.iterdir()) == []


def test_under_plain_torchrun_rank_zero_saves_a_whole_state_that_says_so(
    torchrun: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    torchrun.setenv(protocol.RANK, "0")
    saved = sdk.save(
        str(tmp_path), "job-t", 1, STATE, run_id="r", topology=Topology(world_size=2),
        whole_state=True,
    )  # fmt: skip
    assert saved.manifest.whole_state is True
    report = verify(FsStore(tmp_path), "job-t/step-00000001")
    assert report.verdict is Verdict.VALID, report.reasons


def test_a_declared_topology_of_several_ranks_is_enough_to_refuse(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in (protocol.JOB, protocol.RANK, protocol.WORLD_SIZE):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(sdk.PartialSave, match="declared topology") as err:
        sdk.save(str(tmp_path), "job-d", 1, STATE, run_id="r", topology=Topology(world_size=4))
    assert (err.value.world_size, err.value.source) == (4, "topology")
    # A runner's context whose topology declares several ranks, its WORLD_SIZE unset.
    ctx = sdk.context({protocol.JOB: "job-d", protocol.TOPOLOGY: '{"world_size": 2}'})
    with pytest.raises(sdk.PartialSave, match="declared topology"):
        sdk.save(str(tmp_path), "job-d", 1, STATE, ctx=ctx)
    saved = sdk.save(str(tmp_path), "job-d", 1, STATE, ctx=ctx, whole_state=True)
    assert saved.manifest.whole_state is True


def test_a_single_process_manifest_reads_as_before(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``whole_state`` is written only when it says something: a checker that predates it
    (its manifest model forbids unknown fields) reads a single process's manifest unchanged."""
    for name in (protocol.JOB, protocol.RANK, protocol.WORLD_SIZE):
        monkeypatch.delenv(name, raising=False)
    saved = sdk.save(str(tmp_path), "job-s", 1, STATE, run_id="r")
    raw = (tmp_path / "job-s" / "step-00000001" / native.MANIFEST).read_text()
    assert "whole_state" not in raw
    assert saved.manifest.whole_state is None


def _partial(root: Path, whole_state: bool | None) -> None:
    identity = CheckpointIdentity(job_id="job-p", run_id="r", topology=Topology(world_size=3))
    native.write(FsStore(root), "job-p/step-1", {"rank0.bin": b"r0"}, step=1, created_at=T,
                 identity=identity)  # fmt: skip
    if whole_state is not None:  # rewrite the manifest as a whole-state save writes it
        path = root / "job-p" / "step-1" / native.MANIFEST
        manifest = native.Manifest.model_validate_json(path.read_bytes())
        path.write_bytes(manifest.model_copy(update={"whole_state": whole_state}).dump())


def test_a_manifest_lacking_declared_ranks_is_incomplete_and_quarantined(tmp_path: Path) -> None:
    """What an SDK before this check wrote under plain torchrun: rank 0's part, declared as a
    job of several ranks. The checker's verdict is never `verified`."""
    _partial(tmp_path, None)
    report = verify(FsStore(tmp_path), "job-p/step-1")
    assert report.verdict is Verdict.INCOMPLETE
    assert "no shard of rank(s) 1, 2" in report.reasons[0]

    class Committed:
        job_id, checkpoint_id, uri = "job-p", "c1", "file:///x"

    types = [type(e).__name__ for e in domain.outcome(Committed(), report)]
    assert types == ["CheckpointCorruptV1", "CheckpointQuarantinedV1"]
    # A scrub re-checks bytes, not this: a checkpoint verified before the check keeps its verdict.
    assert verify(FsStore(tmp_path), "job-p/step-1", ranks=False).verdict is Verdict.VALID


def test_a_manifest_that_says_it_holds_the_whole_state_is_valid(tmp_path: Path) -> None:
    _partial(tmp_path, True)
    assert verify(FsStore(tmp_path), "job-p/step-1").verdict is Verdict.VALID
