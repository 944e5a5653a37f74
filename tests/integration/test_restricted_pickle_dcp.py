"""The restricted unpickler reads real DCP metadata (written by torch) well within its memory
estimate (the other bounds: tests/unit/test_restricted_pickle.py)."""

from __future__ import annotations

from pathlib import Path

from ckpt_ha.formats import dcp_metadata
from tests.support.torch_tools import write_dcp
from tests.unit.test_restricted_pickle import _estimate, _real_peak


def test_real_dcp_metadata_costs_well_within_its_estimate(tmp_path: Path) -> None:
    data = (write_dcp(tmp_path / "ckpt") / ".metadata").read_bytes()
    estimate = _estimate(data)
    real = _real_peak(data)
    assert real <= estimate <= 40 * len(data) + 100_000  # ~24 estimated bytes per byte
    assert dcp_metadata.parse(data).items


"""64 MiB .metadata files (what the size limit lets through), and one of 8 bytes."""
