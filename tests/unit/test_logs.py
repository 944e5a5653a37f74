"""Log configuration: ``CKPT_HA_LOG_FORMAT=json`` gives one JSON object per line, carrying the
current OpenTelemetry span's ids; text stays the default; a bad value is one line and exit 2.

Spans come from a real SDK TracerProvider kept local to the test (the process-wide provider is
left alone)."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from ckpt_ha.cli.main import main
from ckpt_ha.telemetry import logs
from tests.support.events import committed


def _raise() -> None:
    raise ValueError("boom")


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            _raise()
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("ckpt_ha.test", logging.WARNING, __file__, 1, message, args, info)


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    tp = TracerProvider()
    yield tp
    tp.shutdown()


def test_a_json_line_inside_a_span_carries_its_trace_and_span_ids(
    provider: TracerProvider,
) -> None:
    formatter = logs.formatter({"CKPT_HA_LOG_FORMAT": "json"})
    with provider.get_tracer("test").start_as_current_span("handle") as span:
        line = formatter.format(record("checkpoint %s verified", "c-1"))
    ctx = span.get_span_context()
    parsed = json.loads(line)
    assert parsed["trace_id"] == f"{ctx.trace_id:032x}"
    assert parsed["span_id"] == f"{ctx.span_id:016x}"
    assert parsed["message"] == "checkpoint c-1 verified"
    assert parsed["level"] == "WARNING"
    assert parsed["logger"] == "ckpt_ha.test"
    assert parsed["time"].endswith("Z")


def test_a_json_line_outside_a_span_has_no_ids_and_keeps_the_exception() -> None:
    line = logs.formatter({"CKPT_HA_LOG_FORMAT": "JSON"}).format(record("failed", exc=True))
    parsed = json.loads(line)
    assert "trace_id" not in parsed
    assert "span_id" not in parsed
    assert "ValueError: boom" in parsed["exception"]
    assert "\n" not in line  # one line per record, whatever the traceback holds


def test_text_is_the_default_format() -> None:
    line = logs.formatter({}).format(record("plain"))
    assert line.endswith("WARNING ckpt_ha.test: plain")
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_configure_replaces_its_own_handler_and_leaves_a_foreign_one_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(logs, "_state", {"json": False})
    level = root.level
    try:
        logs.configure({"CKPT_HA_LOG_FORMAT": "json", "CKPT_HA_LOG_LEVEL": "info"})
        logs.configure({"CKPT_HA_LOG_FORMAT": "json"}, default_level="INFO")
        assert len(root.handlers) == 1
        assert isinstance(root.handlers[0].formatter, logs.JsonFormatter)
        assert root.level == logging.INFO
        assert logs.library_logger("ckpt_ha.app") is logging.getLogger("ckpt_ha.app")
        foreign = logging.StreamHandler(io.StringIO())
        root.handlers = [foreign]
        logs.configure({"CKPT_HA_LOG_FORMAT": "text"})
        assert root.handlers == [foreign]
    finally:
        root.setLevel(level)
    monkeypatch.setattr(logs, "_state", {"json": False})
    assert logs.library_logger("ckpt_ha.app") is None  # text: faststream keeps its own handler


@pytest.mark.parametrize(
    ("variable", "value"), [("CKPT_HA_LOG_FORMAT", "yaml"), ("CKPT_HA_LOG_LEVEL", "LOUD")]
)
def test_a_bad_log_setting_is_one_line_and_a_usage_exit(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["status"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ckpt-ha: {variable}=")
    assert "\n" not in err


def test_no_span_means_no_ids_even_with_a_tracer_installed(provider: TracerProvider) -> None:
    assert logs.current_ids() is None
    with provider.get_tracer("test").start_as_current_span("x"):
        assert logs.current_ids() is not None
    assert trace.get_current_span().get_span_context().is_valid is False


def test_a_json_line_carries_the_job_and_checkpoint_of_the_event_being_handled() -> None:
    """The bus opens an event scope around each message a consumer handles (and each batch):
    every line logged meanwhile names the event's job and checkpoint; a batch of several jobs
    names none; a loop's line names them with ``extra=about(...)``; nothing leaks out."""
    formatter = logs.formatter({"CKPT_HA_LOG_FORMAT": "json"})
    with logs.event_scope(committed("c-7", job="job-7")):
        inside = json.loads(formatter.format(record("registering")))
    assert (inside["job_id"], inside["checkpoint_id"]) == ("job-7", "c-7")
    with logs.event_scope(committed("c-1", job="job-7"), committed("c-2", job="job-7")):
        one_job = json.loads(formatter.format(record("a batch")))
    assert one_job["job_id"] == "job-7"
    assert "checkpoint_id" not in one_job
    with logs.event_scope(committed("c-1", job="job-1"), committed("c-2", job="job-2")):
        mixed = json.loads(formatter.format(record("a batch")))
    assert "job_id" not in mixed
    assert "checkpoint_id" not in mixed
    outside = json.loads(formatter.format(record("between messages")))
    assert "job_id" not in outside
    given = record("job-9 lost")
    given.__dict__.update(logs.about(job_id="job-9"))
    assert json.loads(formatter.format(given))["job_id"] == "job-9"
