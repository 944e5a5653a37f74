"""`torch_pickle.check` reads a torch zip's directory and pickle in a few windows of the
file, never the tensor bytes, and never more than its budget."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import pytest

from ckpt_ha.formats import torch_pickle
from ckpt_ha.formats.restricted_pickle import MalformedPickle
from ckpt_ha.storage import FsStore


class CountingStore(FsStore):
    """A filesystem store that counts its ranged reads (and the bytes they return)."""

    reads: list[int]

    def read_bytes(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        data = super().read_bytes(key, offset=offset, length=length)
        self.reads.append(len(data))
        return data


def _torch_like_zip(path: Path, records: int, record_bytes: int) -> None:
    """The layout ``torch.save`` writes: ``data.pkl`` first, then one record per storage."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"step": 1, "lr": 0.1}, protocol=2))
        archive.writestr("archive/byteorder", "little")
        for i in range(records):
            archive.writestr(f"archive/data/{i}", b"\0" * record_bytes)


def test_a_large_archive_is_checked_in_three_reads(tmp_path: Path) -> None:
    _torch_like_zip(tmp_path / "optimizer.pt", records=300, record_bytes=8192)
    store = CountingStore(tmp_path)
    store.reads = []
    size = (tmp_path / "optimizer.pt").stat().st_size
    assert torch_pickle.check(store, "optimizer.pt", "optimizer.pt", length=size) is None
    # its head, the window holding the end records and directory, the one holding data.pkl
    assert len(store.reads) == 3, store.reads
    assert sum(store.reads) <= 3 * torch_pickle.READ_WINDOW < size // 8


def test_the_reader_never_reads_past_its_budget(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(bytes(range(256)) * 1024)
    store = CountingStore(tmp_path)
    store.reads = []
    reader = torch_pickle.RangeReader(store, "f", 0, 256 * 1024, budget=1000)
    assert reader.read(10) == bytes(range(10))  # no window: it would pass the budget
    reader.seek(500)
    assert reader.read(990) == (bytes(range(256)) * 6)[500:1490]
    assert store.reads == [10, 990]
    with pytest.raises(MalformedPickle, match="more than the limit"):
        reader.read(1)
