"""How every ckpt-ha process logs: one call, `configure`, made by the command line's entry point
(every service process and the runner start there).

``CKPT_HA_LOG_FORMAT=json`` writes one JSON object per line (for a log collector in a
container): time, level, logger, message, the exception if any, and the ``trace_id`` /
``span_id`` of the OpenTelemetry span current when the line was logged, so a line joins its
checkpoint's trace, and the ``job_id`` / ``checkpoint_id`` the line is about: those of the event
being handled (`event_scope`, set by the bus for every message a consumer takes, and for a batch
about one job), or given with the call (``extra=about(job_id=..., checkpoint_id=...)``). The
default, ``text``, is the human format. ``CKPT_HA_LOG_LEVEL`` sets the level (default INFO for
services and the runner's serve-like commands, WARNING for the rest).

OpenTelemetry is optional here: an install without it (the light CLI) logs JSON without ids.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

LOG_FORMAT_ENV = "CKPT_HA_LOG_FORMAT"
LOG_LEVEL_ENV = "CKPT_HA_LOG_LEVEL"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


SCOPE_FIELDS = ("job_id", "checkpoint_id")
_scope: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "ckpt_ha_log_scope", default=None
)


def about(*, job_id: str | None = None, checkpoint_id: str | None = None) -> dict[str, str]:
    """``extra=`` for a log call about a job or a checkpoint outside an event's handling (a
    loop's round): the JSON line carries these fields."""
    fields = {"job_id": job_id, "checkpoint_id": checkpoint_id}
    return {k: v for k, v in fields.items() if v}


def scope_of(events: Iterable[object]) -> dict[str, str]:
    """The fields all ``events`` (envelopes) agree on: a job's events, one checkpoint's."""
    found: dict[str, set[str]] = {name: set() for name in SCOPE_FIELDS}
    count = 0
    for event in events:
        count += 1
        data = getattr(event, "data", None)
        for name in SCOPE_FIELDS:
            value = getattr(data, name, None)
            found[name].add(value if isinstance(value, str) else "")
    return {n: next(iter(v)) for n, v in found.items() if count and len(v) == 1 and "" not in v}


@contextlib.contextmanager
def event_scope(*events: object) -> Iterator[None]:
    """While handling ``events``: every line logged carries the job and checkpoint they are
    all about (none they disagree on)."""
    token = _scope.set(scope_of(events))
    try:
        yield
    finally:
        _scope.reset(token)


def enter_scope(*events: object) -> None:
    """`event_scope` without an end, for a decoder that runs inside a scope its caller opened
    (`event_scope()` with no events) and closes."""
    _scope.set(scope_of(events))


def scope() -> Mapping[str, str]:
    """The fields of the current scope."""
    return _scope.get() or {}


class BadLogSetting(ValueError):
    """CKPT_HA_LOG_FORMAT or CKPT_HA_LOG_LEVEL names no format or level."""


def current_ids() -> tuple[str, str] | None:
    """The current span's ``(trace_id, span_id)`` in W3C hex, or None outside a valid span."""
    try:
        # Imported here, not at the top: a text-logging command does not load OpenTelemetry.
        from opentelemetry import trace
    except ImportError:  # the light install has none: lines carry no ids
        return None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the current span's ids when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(scope())
        for name in SCOPE_FIELDS:
            given = record.__dict__.get(name)
            if given:
                line[name] = str(given)
        ids = current_ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def formatter(env: Mapping[str, str]) -> logging.Formatter:
    """The formatter ``CKPT_HA_LOG_FORMAT`` asks for; raises BadLogSetting on an unknown one."""
    chosen = (env.get(LOG_FORMAT_ENV) or "text").strip().lower()
    if chosen not in FORMATS:
        raise BadLogSetting(f"{LOG_FORMAT_ENV}={chosen!r}: expected one of {', '.join(FORMATS)}")
    return JsonFormatter() if chosen == "json" else logging.Formatter(TEXT_FORMAT)


def library_logger(name: str) -> logging.Logger | None:
    """The logger to hand faststream's app or broker: in JSON mode one that goes through the
    root handler, so its lines are JSON too; None otherwise (faststream then keeps its own
    text handler, as the local stack shows it)."""
    return logging.getLogger(name) if _state["json"] else None


def configure(env: Mapping[str, str], *, default_level: str = "WARNING") -> None:
    """Give the root logger a stderr handler with the format and level ``env`` asks for.

    Like `logging.basicConfig`, it leaves a root logger that already has someone else's handler
    alone (a test runner capturing logs); calling it again replaces only its own handler."""
    level = (env.get(LOG_LEVEL_ENV) or default_level).strip().upper()
    if not isinstance(logging.getLevelName(level), int):
        raise BadLogSetting(f"{LOG_LEVEL_ENV}={level!r}: expected DEBUG, INFO, WARNING or ERROR")
    chosen = formatter(env)
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, _OURS, False)]
    if len(ours) != len(root.handlers):
        return
    for old in ours:
        root.removeHandler(old)
    handler = logging.StreamHandler()
    setattr(handler, _OURS, True)
    handler.setFormatter(chosen)
    root.addHandler(handler)
    root.setLevel(level)
    _state["json"] = isinstance(chosen, JsonFormatter)


_OURS = "_ckpt_ha_handler"
_state = {"json": False}
"""Whether `configure` installed the JSON format (read by `library_logger`)."""
