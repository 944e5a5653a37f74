"""The training SDK on a real filesystem: layout, ids the watcher agrees on, load and its checks."""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from ckpt_ha import sdk
from ckpt_ha.contracts.checkpoint import CheckpointFormat, Topology
from ckpt_ha.formats import native, verify
from ckpt_ha.formats.report import Verdict
from ckpt_ha.sdk import state as codec
from ckpt_ha.storage import FsStore, ObjectInfo
from ckpt_ha.writer_watcher import adapters
from ckpt_ha.writer_watcher.domain import WatchState, observe

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STALL = timedelta(minutes=5)


def tree() -> dict[str, object]:
    return {
        "weights": np.arange(12, dtype=np.float32).reshape(3, 4),
        "blob": b"\x00\x01raw",
        "counter": np.int64(7),
        "nested": {
            0: {"m": np.ones(2, dtype=np.float16), "flag": True},
            "1": [1, 2.5, "three", None, (4, 5)],
            1.5: math.inf,
        },
        "ordered": OrderedDict([("b", 1), ("a", -0.0)]),
        "empty": {},
    }


def test_codec_round_trip_keeps_types_keys_and_order() -> None:
    encoded = codec.encode(tree())
    shards = {leaf.path: leaf.to_bytes() for leaf in encoded.leaves}
    assert all(path.startswith("state/") for path in shards)
    back = codec.decode(encoded.index, shards.__getitem__)
    assert np.array_equal(back["weights"], tree()["weights"])
    assert back["weights"].dtype == np.float32
    assert back["blob"] == b"\x00\x01raw"
    assert back["counter"] == 7
    assert isinstance(back["counter"], np.int64)
    assert list(back["nested"]) == [0, "1", 1.5]  # int and str keys stay distinct
    assert back["nested"][0]["flag"] is True
    assert back["nested"]["1"] == [1, 2.5, "three", None, (4, 5)]
    assert isinstance(back["nested"]["1"][4], tuple)
    assert back["nested"][1.5] == math.inf
    assert isinstance(back["ordered"], OrderedDict)
    assert list(back["ordered"].items()) == [("b", 1), ("a", -0.0)]
    assert math.copysign(1, back["ordered"]["a"]) == -1
    assert back["empty"] == {}
    assert encoded.frameworks == {"numpy"}


def test_leaf_names_never_collide_and_stay_inside() -> None:
    encoded = codec.encode({"a/b": b"1", "a": {"b": b"2"}, "..": b"3", "x y": {".": b"4"}})
    paths = [leaf.path for leaf in encoded.leaves]
    assert len(set(paths)) == 4
    assert all(".." not in p.split("/") and " " not in p for p in paths)
    back = codec.decode(encoded.index, {lf.path: lf.to_bytes() for lf in encoded.leaves}.get)
    assert back == {"a/b": b"1", "a": {"b": b"2"}, "..": b"3", "x y": {".": b"4"}}


@pytest.mark.parametrize(
    "bad", [object(), {"k": {1, 2}}, np.array([object()]), {frozenset(): 1}, {"f": print}]
)
def test_anything_that_would_need_pickle_is_refused(bad: object) -> None:
    with pytest.raises(codec.UnsupportedState, match="without pickle"):
        codec.encode({"x": bad})


def test_save_writes_index_first_manifest_last_and_the_watcher_agrees(tmp_path: Path) -> None:
    saved = sdk.save(
        str(tmp_path), "job-u", 3, tree(), run_id="run-1", attempt=2, project="vision",
        model_version="resnet-7", code_version="abc", topology=Topology(world_size=8),
        image="registry/train:1.2", clock=lambda: T, whole_state=True,
    )  # fmt: skip
    folder = tmp_path / "job-u" / "step-00000003-a2"
    assert saved.uri == f"file://{folder}"
    assert not saved.announced
    paths = [s.path for s in saved.manifest.shards]
    assert paths[0] == sdk.INDEX
    # The index is the oldest file, so the id is fixed before the leaves are written.
    mtimes = {p: (folder / p).stat().st_mtime_ns for p in paths}
    assert mtimes[sdk.INDEX] == min(mtimes.values())
    assert (folder / native.MANIFEST).stat().st_mtime_ns >= max(mtimes.values())

    [seen] = adapters.scan(FsStore(tmp_path))
    [committed] = observe(WatchState(), [seen], T, STALL)
    assert committed.checkpoint_id == saved.checkpoint_id  # type: ignore[attr-defined]
    assert committed.format is CheckpointFormat.NATIVE  # type: ignore[attr-defined]
    assert committed.identity == saved.manifest.identity  # type: ignore[attr-defined]

    identity = saved.manifest.identity
    assert identity is not None
    assert (identity.project, identity.model_version, identity.attempt) == ("vision", "resnet-7", 2)
    assert identity.topology == Topology(world_size=8)
    assert identity.environment is not None
    assert identity.environment.image == "registry/train:1.2"
    assert identity.environment.framework == "numpy"

    # The index is a listed, checksummed shard: nothing in the folder is unaccounted for.
    report = verify(FsStore(folder), "")
    assert report.verdict is Verdict.VALID, report.reasons
    on_disk = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert on_disk == {*paths, native.MANIFEST}


def test_load_returns_what_was_saved(tmp_path: Path) -> None:
    saved = sdk.save(str(tmp_path), "job-u", 1, tree(), run_id="r")
    loaded = sdk.load(saved.uri)
    assert loaded.step == 1
    assert loaded.identity == saved.manifest.identity
    assert np.array_equal(loaded.state["weights"], tree()["weights"])
    assert loaded.state["nested"]["1"] == [1, 2.5, "three", None, (4, 5)]
    same = sdk.load(FsStore(tmp_path), "job-u/step-00000001")
    assert same.state["blob"] == b"\x00\x01raw"


def test_load_checks_every_shard_it_reads(tmp_path: Path) -> None:
    saved = sdk.save(str(tmp_path), "job-u", 1, tree(), run_id="r")
    folder = tmp_path / "job-u" / "step-00000001"
    shard = folder / "state" / "weights.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    shard.write_bytes(bytes(data))
    with pytest.raises(sdk.CheckpointUnreadable, match=r"weights\.npy: checksum") as bad:
        sdk.load(saved.uri)
    assert bad.value.verdict == "corrupt"

    (folder / native.MANIFEST).unlink()
    with pytest.raises(sdk.CheckpointUnreadable) as missing:
        sdk.load(saved.uri)
    assert missing.value.verdict == "incomplete"

    doc = json.loads((folder / sdk.INDEX).read_bytes())
    assert doc["format"] == codec.INDEX_FORMAT


def test_a_folder_with_files_is_never_written_again(tmp_path: Path) -> None:
    sdk.save(str(tmp_path), "job-u", 5, {"w": b"first"}, run_id="r1")
    with pytest.raises(sdk.CheckpointExists, match="already holds files"):
        sdk.save(str(tmp_path), "job-u", 5, {"w": b"second"}, run_id="r2")
    (tmp_path / "job-u" / "step-00000006").mkdir()
    (tmp_path / "job-u" / "step-00000006" / "partial.bin").write_bytes(b"left over")
    with pytest.raises(sdk.CheckpointExists):
        sdk.save(str(tmp_path), "job-u", 6, {"w": b"x"}, run_id="r2")
    with pytest.raises(codec.UnsupportedState):  # refused before anything is written
        sdk.save(str(tmp_path), "job-u", 7, {"w": object()}, run_id="r")
    assert not (tmp_path / "job-u" / "step-00000007").exists()
    assert sdk.load(f"{tmp_path}/job-u/step-00000005").state == {"w": b"first"}


def test_a_later_attempt_saves_a_recomputed_step_in_its_own_folder(tmp_path: Path) -> None:
    (tmp_path / "job-u" / "step-00000040").mkdir(parents=True)  # attempt 1 killed mid-write
    (tmp_path / "job-u" / "step-00000040" / "partial.bin").write_bytes(b"left over")
    saved = sdk.save(str(tmp_path), "job-u", 40, {"w": b"again"}, run_id="r", attempt=2)
    assert saved.uri.endswith("/job-u/step-00000040-a2")
    assert sdk.load(saved.uri).state == {"w": b"again"}
    assert (tmp_path / "job-u" / "step-00000040" / "partial.bin").read_bytes() == b"left over"
    assert sdk.folder_for("j", 3) == sdk.folder_for("j", 3, 1) == "j/step-00000003"
    assert sdk.folder_for("j", 3, 4) == "j/step-00000003-a4"


def test_bytes_only_state_names_no_framework(tmp_path: Path) -> None:
    saved = sdk.save(str(tmp_path), "job-u", 1, {"w": b"x"}, run_id="r")
    env = saved.manifest.identity.environment  # type: ignore[union-attr]
    assert env is not None
    assert env.framework is None
    assert env.python_version


def test_native_checkpoints_without_a_state_index_load_too(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    arr = np.arange(5)
    npy = codec.Leaf("x", arr).to_bytes()
    native.write(store, "job-l/step-1", {"w.npy": npy, "opt.bin": b"o"}, step=1, created_at=T)
    loaded = sdk.load(store, "job-l/step-1")
    assert set(loaded.state) == {"w", "opt.bin"}
    assert np.array_equal(loaded.state["w"], arr)
    assert loaded.state["opt.bin"] == b"o"


class SteppedBackClock(FsStore):
    """A filesystem whose clock stepped back while the leaves were written."""

    def put(self, key: str, data: object, *, metadata: object = None) -> ObjectInfo:
        info = super().put(key, data, metadata=metadata)  # type: ignore[arg-type]
        if "/state/" in key:
            path = self.root / key
            os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns - 10**10))
        return info


def test_committed_carries_the_id_the_watcher_derives_even_if_the_clock_stepped(
    tmp_path: Path,
) -> None:
    saved = sdk.save(SteppedBackClock(tmp_path), "job-c", 1, {"w": b"x"}, run_id="r")
    [seen] = adapters.scan(FsStore(tmp_path))
    [committed] = observe(WatchState(), [seen], T, STALL)
    assert saved.checkpoint_id == committed.checkpoint_id  # type: ignore[attr-defined]


def test_the_old_name_of_the_sdks_bus_endpoint_still_resolves_with_a_warning() -> None:
    """Training code written against ``ckpt_ha.sdk.Bus`` keeps running after the rename."""
    with pytest.warns(DeprecationWarning, match="BusEndpoint"):
        assert sdk.Bus is sdk.BusEndpoint
    with pytest.raises(AttributeError):
        sdk.Nope  # noqa: B018


def test_the_process_environment_is_looked_up_once_per_process() -> None:
    """A save records the versions this process runs; looking them up scans the import path,
    so it is done once, not on every save (issue 32)."""
    from ckpt_ha.sdk.checkpoints import process_environment

    first = process_environment(frozenset({"numpy"}), None, ("pydantic",))
    assert first.libraries["numpy"] == np.__version__
    assert "pydantic" in first.libraries
    assert process_environment(frozenset({"numpy"}), None, ("pydantic",)) is first
    assert process_environment(frozenset({"numpy"}), "an-image", ("pydantic",)).image == "an-image"
