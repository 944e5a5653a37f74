"""Trace-context helpers: W3C strings ↔ contexts, continuing a stored trace, the OTEL_* switch.

Spans are recorded by a real SDK TracerProvider with an in-memory exporter, installed as this
module's provider (the process-wide global provider is left alone).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from ckpt_ha.bus import publishing
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointCorruptV1
from ckpt_ha.core.records import project
from ckpt_ha.telemetry import tracing
from ckpt_ha.writer_watcher import adapters
from ckpt_ha.writer_watcher.domain import Tracked
from tests.support.events import T0, committed, verified

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER = "00-11111111111111111111111111111111-2222222222222222-01"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_provider", provider)
    yield exporter
    provider.shutdown()


def hex_trace(span: object) -> str:
    return format(span.context.trace_id, "032x")  # type: ignore[attr-defined]


def test_traceparent_round_trips_through_a_context() -> None:
    ctx = tracing.context_of(TP, "vendor=1")
    assert ctx is not None
    assert tracing.traceparent_of(ctx) == (TP, "vendor=1")
    assert tracing.trace_id_of(TP) == "0af7651916cd43dd8448eb211c80319c"


@pytest.mark.parametrize(
    "bad",
    [None, "", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01"],
)
def test_absent_or_invalid_traceparent_gives_no_context(bad: str | None) -> None:
    assert tracing.context_of(bad) is None
    assert tracing.trace_id_of(bad) is None
    assert tracing.link_to(bad) == []
    assert not tracing.same_trace(bad, bad)


def test_same_trace_compares_trace_ids_only() -> None:
    sibling = TP[:36] + "0000000000000001-01"
    assert tracing.same_trace(TP, sibling)
    assert not tracing.same_trace(TP, OTHER)


def test_new_traceparent_is_a_fresh_valid_sampled_root() -> None:
    a, b = tracing.new_traceparent(), tracing.new_traceparent()
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", a)
    assert tracing.context_of(a) is not None
    assert not tracing.same_trace(a, b)


def test_no_current_span_means_no_traceparent() -> None:
    assert tracing.current_traceparent() is None


def test_continue_trace_is_a_child_of_the_stored_context_linked_to_the_trigger(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.span("scrub.round") as trigger, tracing.continue_trace("scrub.corrupt", TP):
        inner = tracing.current_traceparent()
    finished = {s.name: s for s in spans.get_finished_spans()}
    child = finished["scrub.corrupt"]
    assert hex_trace(child) == tracing.trace_id_of(TP)
    assert child.parent is not None
    assert format(child.parent.span_id, "016x") == TP.split("-")[2]
    linked = {(link.context.trace_id, link.attributes["ckpt_ha.link"]) for link in child.links}
    assert linked == {
        (trigger.get_span_context().trace_id, "trigger"),
        (int(TP.split("-")[1], 16), "checkpoint"),
    }
    # What is published inside it carries the checkpoint's trace.
    assert inner is not None
    assert tracing.same_trace(inner[0], TP)


def test_continue_trace_without_a_stored_context_is_a_plain_child(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.span("outer") as outer, tracing.continue_trace("late", None):
        pass
    late = next(s for s in spans.get_finished_spans() if s.name == "late")
    assert late.parent is not None
    assert late.parent.span_id == outer.get_span_context().span_id
    assert not late.links


def test_a_scope_entered_at_each_step_is_one_span_in_the_stored_trace(
    spans: InMemorySpanExporter,
) -> None:
    """A burst's failure: its steps interleaved with another failure's, one span each,
    opened at the first step as `continue_trace` opens it, re-entered (not re-opened) later,
    ended by `end`; what is built inside carries its context."""
    first, second = tracing.Scope("failure", TP), tracing.Scope("failure", OTHER)
    seen: list[tuple[str, str | None] | None] = []
    with tracing.span("batch") as trigger:
        for _ in range(3):  # three steps, the two failures' alternating
            for scope in (first, second):
                with scope.entered():
                    seen.append(tracing.current_traceparent())
                    with tracing.span("step"):
                        pass
        assert tracing.current_traceparent() == tracing.traceparent_of(
            trace.set_span_in_context(trigger)
        )
    assert not [s for s in spans.get_finished_spans() if s.name == "failure"]  # still open
    first.end()
    second.end()
    first.end()  # once only
    failures = [s for s in spans.get_finished_spans() if s.name == "failure"]
    assert sorted(hex_trace(s) for s in failures) == sorted([TP.split("-")[1], OTHER.split("-")[1]])
    one = next(s for s in failures if hex_trace(s) == TP.split("-")[1])
    assert one.parent is not None
    assert format(one.parent.span_id, "016x") == TP.split("-")[2]
    assert [link.attributes["ckpt_ha.link"] for link in one.links] == ["trigger", "checkpoint"]
    assert one.links[0].context.span_id == trigger.get_span_context().span_id
    steps = [s for s in spans.get_finished_spans() if s.name == "step"]
    assert len(steps) == 6
    assert {s.parent.span_id for s in steps if s.parent} == {f.context.span_id for f in failures}
    assert [p is not None and tracing.same_trace(p[0], TP) for p in seen[::2]] == [True] * 3
    assert [p is not None and tracing.same_trace(p[0], OTHER) for p in seen[1::2]] == [True] * 3


def test_an_error_leaving_a_scope_marks_its_span(spans: InMemorySpanExporter) -> None:
    scope = tracing.Scope("failure", None)
    with pytest.raises(ValueError, match="bad"), scope.entered():
        raise ValueError("bad")
    scope.end()
    [done] = spans.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR
    assert not done.links  # no stored context: a plain child, as continue_trace's


def test_without_a_provider_a_scope_makes_the_stored_context_current_at_each_entry() -> None:
    stored = tracing.new_traceparent()
    scope, none = tracing.Scope("x", stored), tracing.Scope("y", None)
    for _ in range(2):
        with scope.entered() as current:
            assert not current.is_recording()
            assert tracing.current_traceparent() == (stored, None)
        assert tracing.current_traceparent() is None
        with none.entered():
            assert tracing.current_traceparent() is None
    scope.end()


def test_in_context_makes_a_stored_context_current_only_when_no_span_is() -> None:
    with tracing.in_context(TP):
        current = tracing.current_traceparent()
    assert current is not None
    assert current[0] == TP
    assert tracing.current_traceparent() is None
    with tracing.in_context(None):
        assert tracing.current_traceparent() is None


def test_fail_marks_the_span_error_with_the_reason(spans: InMemorySpanExporter) -> None:
    with tracing.span("checkpoint.verify"):
        tracing.fail("a.bin: checksum mismatch", code="checkpoint_corrupt")
    [done] = spans.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR
    assert done.status.description == "a.bin: checksum mismatch"
    assert done.attributes is not None
    assert done.attributes["ckpt_ha.reason"] == "a.bin: checksum mismatch"
    assert done.attributes["ckpt_ha.error_code"] == "checkpoint_corrupt"
    assert [e.name for e in done.events] == ["ckpt_ha.failure"]


def test_without_a_provider_a_continued_trace_is_current_and_nothing_records() -> None:
    """Without a tracer no span is made, but the stored context is current inside (follow-ups
    published there carry it) and the one before is current again after."""
    assert not tracing.recording()
    stored = tracing.new_traceparent()
    with tracing.continue_trace("x", stored) as current:
        assert not current.is_recording()
        assert tracing.current_traceparent() == (stored, None)
    assert tracing.current_traceparent() is None
    with tracing.continue_trace("y", None) as current:
        assert tracing.current_traceparent() is None


def test_a_provider_makes_spans_record(spans: InMemorySpanExporter) -> None:
    assert tracing.recording()
    with tracing.span("x") as current:
        assert current.is_recording()


def test_without_a_provider_spans_cost_nothing_and_record_nothing() -> None:
    assert tracing._provider is None
    with tracing.span("x") as current:
        tracing.fail("ignored")
        tracing.annotate(a=1)
        assert not current.is_recording()


@pytest.mark.parametrize(
    ("env", "choice"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, None),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
    ],
)
def test_exporter_choice_follows_the_standard_variables(
    env: dict[str, str], choice: str | None
) -> None:
    assert tracing.exporter_choice(env) == choice


def test_setup_installs_nothing_without_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_TRACES_EXPORTER",
    ):
        monkeypatch.delenv(name, raising=False)
    before = trace.get_tracer_provider()
    assert tracing.setup("registrar") is False
    assert tracing._provider is None
    assert trace.get_tracer_provider() is before
    tracing.shutdown()  # a no-op


@pytest.mark.parametrize(
    ("env", "protocol"),
    [
        ({}, "http/protobuf"),  # the OpenTelemetry specification's default
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": " GRPC "}, "grpc"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": ""}, "http/protobuf"),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
            "grpc",
        ),
    ],
)  # fmt: skip
def test_otlp_protocol_follows_the_standard_variables(env: dict[str, str], protocol: str) -> None:
    assert tracing.otlp_protocol(env) == protocol


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
)
def test_an_unsupported_protocol_is_refused_not_silently_replaced(variable: str) -> None:
    with pytest.raises(tracing.UnsupportedProtocolError, match=f"{variable}='http/json'"):
        tracing.otlp_protocol({variable: "http/json"})


def test_setup_refuses_an_unsupported_protocol_before_installing_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    with pytest.raises(tracing.UnsupportedProtocolError):
        tracing.setup("registrar")
    assert tracing._provider is None


@pytest.mark.parametrize(
    ("protocol", "module"),
    [
        ("grpc", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
        ("http/protobuf", "opentelemetry.exporter.otlp.proto.http.trace_exporter"),
    ],
)
def test_each_protocol_gets_its_own_exporter(protocol: str, module: str) -> None:
    exporter = tracing.otlp_exporter(protocol)
    try:
        assert type(exporter).__module__ == module
    finally:
        exporter.shutdown()


def test_the_registry_keeps_the_first_trace_context_of_a_checkpoint() -> None:
    first = committed("c1").model_copy(update={"traceparent": TP})
    record, _ = project(None, first)
    assert record is not None
    assert record.traceparent == TP
    later = verified("c1").model_copy(update={"traceparent": OTHER})
    after, _ = project(record, later)
    assert after is not None
    assert after.traceparent == TP


def test_a_checkpoint_first_heard_of_without_context_adopts_the_next_one() -> None:
    record, _ = project(None, committed("c1"))
    assert record is not None
    assert record.traceparent is None
    after, _ = project(record, verified("c1").model_copy(update={"traceparent": OTHER}))
    assert after is not None
    assert after.traceparent == OTHER


def test_the_watchers_tracked_entry_keeps_its_trace_across_restarts() -> None:
    tracked = Tracked("c1", T0, T0, (("a.bin", 3),), phase="writing", uri="file:///x")
    with_trace = dataclasses.replace(tracked, traceparent=TP)
    assert adapters.tracked_from_json(adapters.tracked_to_json(with_trace)) == with_trace
    assert adapters.tracked_from_json(adapters.tracked_to_json(tracked)) == tracked


def test_event_attributes_name_job_checkpoint_and_reason() -> None:
    event = committed("c", job="j")
    attrs = tracing.event_attributes(event)
    assert attrs["ckpt_ha.job_id"] == "j"
    assert attrs["ckpt_ha.checkpoint_id"] == "c"
    assert attrs["ckpt_ha.event_type"] == "checkpoint.committed"
    assert attrs["ckpt_ha.event_id"] == event.id
    corrupt = build(
        CheckpointCorruptV1(job_id="j", checkpoint_id="c", uri="file:///x", reason="a: bad"),
        source="t",
        time=T0,
        key="k",
    )
    assert tracing.event_attributes(corrupt)["ckpt_ha.reason"] == "a: bad"


async def test_a_recorded_publish_is_a_producer_span_whose_context_the_headers_carry(
    spans: InMemorySpanExporter,
) -> None:
    """The bus publishes on the JetStream client itself: its own publish span is the producer
    span (a child of the event's context) and the headers hand it on, as faststream's tracing
    middleware did, so a consumer's span is its child; the envelope keeps its own context."""
    sent: list[tuple[str, bytes, dict[str, str]]] = []

    async def send(subject: str, body: bytes, headers: Mapping[str, str]) -> object:
        sent.append((subject, body, dict(headers)))
        return None

    event = committed("ck-produced", traceparent=TP)
    published = await publishing.publish(BusConfig(), event, send)
    [(subject, body, headers)] = sent
    [span] = spans.get_finished_spans()
    assert span.name == "publish checkpoint.committed"
    assert span.kind is trace.SpanKind.PRODUCER
    assert span.parent is not None
    assert format(span.parent.span_id, "016x") == TP.split("-")[2]
    assert hex_trace(span) == TP.split("-")[1]
    assert span.attributes is not None
    assert span.attributes["messaging.destination.name"] == subject
    assert span.attributes["messaging.message.conversation_id"] == event.id
    assert headers["traceparent"].split("-")[1:3] == [
        hex_trace(span),
        format(span.context.span_id, "016x"),
    ]
    assert headers["Nats-Msg-Id"] == event.id
    assert published.traceparent == TP
    assert body == event.to_bytes()
