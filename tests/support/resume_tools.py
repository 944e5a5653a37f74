"""Resume plans for tests that play the restore-coordinator, a runner's environment, the SDK's
events as the broker stored them, and exact float comparison."""

from __future__ import annotations

import json
import struct
import uuid
from pathlib import Path

from ckpt_ha.contracts.resume import Compatibility, ResumeMode, ResumePlannedV2
from ckpt_ha.contracts.subjects import event_subject
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.sdk import protocol
from ckpt_ha.storage import FsStore
from tests.support.bus_tools import job_key, stream_messages


def plan_for(
    root: Path,
    job_id: str,
    step: int,
    *,
    attempt: int = 2,
    failed_run_id: str = "run-1",
    folder: str | None = None,
    checkpoint_format: str | None = None,
) -> ResumePlannedV2:
    """The plan a coordinator would publish for the checkpoint ``<job>/<folder>`` under root
    (``folder`` defaults to the native SDK's ``step-<step>``)."""
    store = FsStore(root)
    folder = f"{job_id}/{folder or f'step-{step:08d}'}"
    return ResumePlannedV2(
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
        checkpoint_format=checkpoint_format,
    )


def runner_env(settings: ServiceSettings, root: Path, job: str, **extra: str) -> dict[str, str]:
    """The variables a runner gives attempt 2 of ``job`` (run ``run-1``)."""
    return {
        protocol.JOB: job,
        protocol.RUN_ID: "run-1",
        protocol.ATTEMPT: "2",
        protocol.STORAGE_ROOT: str(root),
        protocol.NATS_URL: settings.nats_url,
        protocol.SUBJECT_PREFIX: settings.subject_prefix,
        protocol.PROGRESS_FILE: str(root / "progress"),
        protocol.JOB_KEY: job_key(job).hex(),
        **extra,
    }


async def events(
    settings: ServiceSettings, event_type: str, job_id: str | None = None
) -> list[dict[str, object]]:
    """The data of every ``event_type`` event in the test's stream (of ``job_id`` if given):
    the progress stream for a report."""
    out = []
    stream = settings.bus().stream_of(event_subject(settings.subject_prefix, event_type, 1, "j"))
    for msg in await stream_messages(settings.nats_url, stream):
        doc = json.loads(msg.data)
        wanted = job_id is None or doc["data"]["job_id"] == job_id
        if wanted and doc["type"].startswith(f"ckpt-ha.{event_type}.v"):
            out.append(doc["data"])
    return out


def bits(value: float) -> int:
    """The float64 bit pattern: equal bits, not merely equal-looking numbers."""
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])
