"""The torch example job resumes bit for bit: after restoring the checkpoint at step k, every
later step's loss has exactly the float64 bits of the uninterrupted run (same seed). Needs
torch; the numpy jobs: tests/unit/test_example_jobs.py."""

from __future__ import annotations

from pathlib import Path

from tests.support.torch_tools import require_torch
from tests.unit.test_example_jobs import (
    assert_bit_for_bit,
    interrupted_then_resumed,
)


def test_torch_job_resumes_bit_for_bit(tmp_path: Path) -> None:
    require_torch()
    from ckpt_ha.lab.examples import torch_mlp

    uninterrupted, resumed = interrupted_then_resumed(torch_mlp.train, tmp_path, "pt-job", 33, 30)
    assert_bit_for_bit(uninterrupted, resumed, 30)
    assert uninterrupted[-1][1] < uninterrupted[0][1]
