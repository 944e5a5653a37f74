"""Report training progress without ever blocking a step (one background publisher per bus
and process), and fingerprint state for the continuity check."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping

import numpy as np

from ckpt_ha.contracts.bounds import MAX_METRICS, MAX_NAME, MAX_SAFE_INT
from ckpt_ha.contracts.job import JobProgressV1
from ckpt_ha.core.clock import utc_now
from ckpt_ha.sdk import marks
from ckpt_ha.sdk import publisher as background
from ckpt_ha.sdk.protocol import BusEndpoint, Context, context
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

    Raises ValueError, before anything is written or queued, for a metric that is not a finite
    number (NaN, Infinity: JSON cannot carry them, and a report every consumer refuses would
    only be dead-lettered) and for a step or data position outside 0 .. 2**53-1.
    """
    values = finite_metrics(metrics)
    for name, value in (("step", step), ("data_position", data_position)):
        if value is not None and not 0 <= value <= MAX_SAFE_INT:
            raise ValueError(f"{name} {value} is outside 0 .. 2**53-1")
    ctx = ctx if ctx is not None else context()
    if ctx is None:
        return False
    if ctx.progress_file is not None:
        _write_progress(ctx.progress_file, step)
        marks.stepped(ctx, step)
    if ctx.bus is None:
        return False
    event = JobProgressV1(
        job_id=ctx.job_id,
        run_id=ctx.run_id,
        attempt=ctx.attempt,
        step=step,
        data_position=data_position,
        rng_fingerprint=rng_fingerprint,
        metrics=values,
        plan_id=ctx.plan.plan_id if ctx.plan is not None else None,
    )
    key = f"job.progress|{ctx.job_id}|{ctx.run_id}|{ctx.attempt}|{step}"
    return background.publisher_for(ctx.bus).submit(event, utc_now(), key)


def finite_metrics(metrics: Mapping[str, float] | None) -> dict[str, float]:
    """``metrics`` as floats; ValueError naming the first one that is not a finite number, or
    when there are more (or longer names) than an event carries (`ckpt_ha.contracts.bounds`).

    A training loop that may see a NaN loss filters it itself (as the Hugging Face callback
    does): ckpt-ha never guesses what a NaN should be reported as.
    """
    values: dict[str, float] = {}
    for name, value in (metrics or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"metric {name!r} is {value!r}, not a number") from None
        if not math.isfinite(number):
            raise ValueError(
                f"metric {name!r} is {number}: progress reports carry finite numbers only "
                "(JSON has no NaN or Infinity); leave it out or report it as a finite value"
            )
        if len(name) > MAX_NAME:
            raise ValueError(f"metric name {name[:40]!r}... is longer than {MAX_NAME} characters")
        values[name] = number
    if len(values) > MAX_METRICS:
        raise ValueError(f"{len(values)} metrics; a progress report carries at most {MAX_METRICS}")
    return values


def progress_stats(bus: BusEndpoint | None = None) -> PublisherStats | None:
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
