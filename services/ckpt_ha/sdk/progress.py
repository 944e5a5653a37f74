"""Report training progress without ever blocking a step (one background publisher per bus
and process), and fingerprint state for the continuity check."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping

import numpy as np

from ckpt_ha.contracts.job import JobProgressV1
from ckpt_ha.core.clock import utc_now
from ckpt_ha.sdk import publisher as background
from ckpt_ha.sdk.protocol import Bus, Context, context
from ckpt_ha.sdk.publisher import PublisherStats

log = logging.getLogger("ckpt_ha.sdk")


def progress(
    step: int,
    *,
    data_position: int | None = None,
    rng_fingerprint: str | None = None,
    metrics: Mapping[str, float] | None = None,
    ctx: Context | None = None,
) -> bool:
    """Report one training step (``job.progress``; with the plan id on a resumed attempt).

    Never waits for the bus: the report is queued for this process's background publisher
    (one connection per bus, opened on the first report) and sent from there; when the queue
    is full the oldest queued report is dropped, counted (`progress_stats`) and reported in the
    next published one. Also writes the step to the runner's progress file, so a failure report
    carries the last step even when the bus is down.

    Returns whether the report was queued without pushing an older one out: False outside a
    runner (nothing is reported), without a bus, or when the queue was full.
    """
    ctx = ctx if ctx is not None else context()
    if ctx is None:
        return False
    if ctx.progress_file is not None:
        _write_progress(ctx.progress_file, step)
    if ctx.bus is None:
        return False
    event = JobProgressV1(
        job_id=ctx.job_id,
        run_id=ctx.run_id,
        attempt=ctx.attempt,
        step=step,
        data_position=data_position,
        rng_fingerprint=rng_fingerprint,
        metrics={k: float(v) for k, v in (metrics or {}).items()},
        plan_id=ctx.plan.plan_id if ctx.plan is not None else None,
    )
    key = f"job.progress|{ctx.job_id}|{ctx.run_id}|{ctx.attempt}|{step}"
    return background.publisher_for(ctx.bus).submit(event, utc_now(), key)


def progress_stats(bus: Bus | None = None) -> PublisherStats | None:
    """What the progress publisher of ``bus`` (default: this attempt's) has published, dropped
    and still holds; None when it has not been used in this process."""
    if bus is None:
        ctx = context()
        bus = ctx.bus if ctx is not None else None
    return background.stats_for(bus) if bus is not None else None


def flush_progress(timeout_s: float = 5.0) -> bool:
    """Wait up to ``timeout_s`` until the queued progress reports are published (True if all
    were). Runs at exit by itself; returns at once while the bus is known to be down."""
    return background.flush_all(timeout_s)


def _write_progress(path: str, step: int) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as out:
            out.write(f"{step}\n")
        os.replace(tmp, path)  # atomic: the runner never reads half a number
    except OSError as exc:
        log.warning("cannot write the progress file %s: %r", path, exc)


def fingerprint(value: object) -> str:
    """A short, stable digest of an RNG state (or any JSON/array tree), for ``rng_fingerprint``.

    numpy arrays and bytes are hashed by dtype, shape and content; everything else as canonical
    JSON (dict keys sorted), so the same state always gives the same fingerprint.
    """
    digest = hashlib.sha256()

    def feed(v: object) -> None:
        if isinstance(v, np.ndarray):
            digest.update(f"nd:{v.dtype.str}:{v.shape}:".encode())
            digest.update(np.ascontiguousarray(v).tobytes())
        elif isinstance(v, bytes | bytearray):
            digest.update(b"b:" + bytes(v))
        elif isinstance(v, Mapping):
            digest.update(b"{")
            for k in sorted(v, key=str):
                digest.update(json.dumps(str(k)).encode() + b":")
                feed(v[k])
            digest.update(b"}")
        elif isinstance(v, list | tuple):
            digest.update(b"[")
            for item in v:
                feed(item)
                digest.update(b",")
            digest.update(b"]")
        elif hasattr(v, "numpy") and hasattr(v, "detach"):  # a torch tensor
            feed(v.detach().cpu().numpy())
        else:
            digest.update(json.dumps(v, sort_keys=True, default=str).encode())

    feed(value)
    return digest.hexdigest()[:16]
