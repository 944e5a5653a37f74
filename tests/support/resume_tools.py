"""Resume plans for tests that play the restore-coordinator, and exact float comparison."""

from __future__ import annotations

import struct
import uuid
from pathlib import Path

from ckpt_ha.contracts.resume import Compatibility, ResumeMode, ResumePlannedV1
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.storage import FsStore


def plan_for(
    root: Path, job_id: str, step: int, *, attempt: int = 2, failed_run_id: str = "run-1"
) -> ResumePlannedV1:
    """The plan a coordinator would publish for the checkpoint ``<job>/step-<step>`` under root."""
    store = FsStore(root)
    folder = f"{job_id}/step-{step:08d}"
    return ResumePlannedV1(
        job_id=job_id,
        plan_id=f"plan-{uuid.uuid4().hex[:12]}",
        failed_run_id=failed_run_id,
        attempt=attempt,
        checkpoint_id=checkpoint_id_on(store, folder),
        checkpoint_uri=store.uri(folder),
        step=step,
        mode=ResumeMode.EXACT,
        compatibility=Compatibility.IDENTICAL,
        expected_step=step,
    )


def bits(value: float) -> int:
    """The float64 bit pattern: equal bits, not merely equal-looking numbers."""
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])
