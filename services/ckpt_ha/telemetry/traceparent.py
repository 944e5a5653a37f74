"""W3C trace context as plain strings, without OpenTelemetry.

The training SDK announces a checkpoint's events with a ``traceparent`` but must not import
OpenTelemetry (a training image installs numpy, pydantic and nats-py only). It joins the training
code's current span only when that code traces, i.e. when it has imported OpenTelemetry already:
no current span can exist otherwise, so nothing is imported just to find none.
"""

from __future__ import annotations

import secrets
import sys


def new_traceparent() -> str:
    """A fresh sampled root context, for a process that records no spans itself (the SDK)."""
    trace_id = secrets.token_hex(16)
    span_id = secrets.token_hex(8)
    if int(trace_id, 16) == 0 or int(span_id, 16) == 0:  # pragma: no cover - 2^-64
        return new_traceparent()
    return f"00-{trace_id}-{span_id}-01"


def current_or_new() -> str:
    """The current span's ``traceparent`` when this process traces with OpenTelemetry (its API
    is imported), else a fresh root context."""
    if "opentelemetry.trace" in sys.modules:
        from ckpt_ha.telemetry import tracing

        current = tracing.current_traceparent()
        if current is not None:
            return current[0]
    return new_traceparent()
