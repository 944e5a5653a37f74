"""OpenTelemetry tracing: one trace per checkpoint, exported over OTLP.

A checkpoint's first event (``writing`` or ``committed``, from the SDK or the writer-watcher) is
the root of its trace. Its W3C trace context travels in the NATS ``traceparent`` header (the
bus's publish span's, `ckpt_ha.bus.publishing`) and in the envelope's ``traceparent``; follow-ups
are published in the context of their cause (`Bus.publish_caused_by`), and the registry stores
the context with the checkpoint so a transition hours later (scrub, restore, retention) continues
the same trace and links to the span that started it.

Export is configured by the standard variables only: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``: ``grpc`` or ``http/protobuf``, the specification's
default), ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``), ``OTEL_SERVICE_NAME`` /
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``, ``OTEL_TRACES_SAMPLER``. With no endpoint (and no
explicit exporter) nothing is installed: the API's no-op tracer is used, spans cost a function
call, and nothing is exported or logged.

When spans are exported, the botocore (S3) and redis (registry) client calls are traced too, by
OpenTelemetry's own instrumentations, as children of the span that made them. A call made outside
any span (a polling loop, a health check) records nothing: those instrumentations get a provider
that never starts a trace of its own.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# Re-exported: defined once, in the module the training SDK can import without OpenTelemetry.
from ckpt_ha.telemetry.traceparent import new_traceparent as new_traceparent

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

TRACER_NAME = "ckpt_ha"
_PROPAGATOR = TraceContextTextMapPropagator()
_provider: Any = None
"""The SDK TracerProvider this process installed (None: tracing off)."""


def service_name(service: str) -> str:
    return f"ckpt-ha-{service}"


def exporter_choice(env: dict[str, str] | os._Environ[str] | None = None) -> str | None:
    """Which exporter the OTEL_* variables ask for: ``otlp``, ``console`` or None (off)."""
    env = os.environ if env is None else env
    chosen = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if chosen in ("none", "off"):
        return None
    if chosen in ("otlp", "console"):
        return chosen
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    return "otlp" if endpoint else None


PROTOCOLS = ("grpc", "http/protobuf")
"""The OTLP transports this project exports over (``http/json`` has no Python exporter)."""


class UnsupportedProtocolError(ValueError):
    """``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` names a transport tracing cannot export over."""

    def __init__(self, variable: str, value: str) -> None:
        self.variable = variable
        self.value = value
        super().__init__(
            f"{variable}={value!r}: tracing exports over OTLP {' or '.join(PROTOCOLS)} only"
        )


def otlp_protocol(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """The OTLP transport the OTEL_* variables ask for: ``grpc`` or ``http/protobuf``.

    The traces-specific variable wins over the general one; with neither, ``http/protobuf`` (the
    OpenTelemetry specification's default). Anything else raises: exporting over a transport the
    collector does not listen on would lose every span without a word.
    """
    env = os.environ if env is None else env
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(variable, "").strip()
        if not value:
            continue
        if value.lower() not in PROTOCOLS:
            raise UnsupportedProtocolError(variable, value)
        return value.lower()
    return "http/protobuf"


def otlp_exporter(protocol: str) -> SpanExporter:
    """The SDK's OTLP span exporter for ``protocol``; it reads endpoint, headers, timeout and
    compression from the standard variables itself."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    return HttpSpanExporter()


def instrument_clients(provider: TracerProvider, processor: SpanProcessor) -> None:
    """Trace S3 (botocore) and Redis calls as children of the current span; idempotent.

    The instrumentations get their own provider, with ``provider``'s resource and its export
    ``processor``, whose sampler is parent-based with roots off: a client call inside a
    checkpoint's span joins that trace (and its sampling decision), one outside any span starts
    no trace.
    """
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    children = SdkTracerProvider(
        resource=provider.resource,
        sampler=ParentBased(root=ALWAYS_OFF),
        shutdown_on_exit=False,  # ``provider`` flushes and stops the shared processor
    )
    children.add_span_processor(processor)
    for instrumentor in _client_instrumentors():
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=children)


def uninstrument_clients() -> None:
    for instrumentor in _client_instrumentors():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()


def _client_instrumentors() -> list[Any]:
    """The botocore and redis instrumentors (singletons; the botocore one is untyped)."""
    from opentelemetry.instrumentation.botocore import BotocoreInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    classes: tuple[Any, ...] = (BotocoreInstrumentor, RedisInstrumentor)
    return [cls() for cls in classes]


def setup(service: str) -> bool:
    """Install the process's tracer provider when OTEL_* asks for export; idempotent.

    ``service.name`` is ``ckpt-ha-<service>`` unless ``OTEL_SERVICE_NAME`` says otherwise.
    Returns whether spans are exported.
    """
    global _provider
    if _provider is not None:
        return True
    choice = exporter_choice()
    if choice is None:
        return False
    # Checked before anything is installed: a wrong protocol fails the start, loudly.
    protocol = otlp_protocol() if choice == "otlp" else None
    # Imported only when tracing is on: a process without OTEL_* loads no SDK or exporter.
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    attrs = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name(service)}
    provider = SdkTracerProvider(resource=Resource.create(attrs))
    exporter = ConsoleSpanExporter() if protocol is None else otlp_exporter(protocol)
    processor = BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    instrument_clients(provider, processor)
    _provider = provider
    return True


def shutdown() -> None:
    """Flush and stop the exporter (service stop); a no-op when tracing is off."""
    global _provider
    if _provider is not None:
        uninstrument_clients()
        _provider.shutdown()
        _provider = None


def recording() -> bool:
    """Whether any span would be recorded: a provider `setup` installed, or one the host process
    installed globally. Without one, `span` and `continue_trace` only make a context current
    (what OpenTelemetry's no-op tracer does too), without building spans, links or attributes:
    a consumer opens one per event."""
    return _provider is not None or not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def tracer() -> trace.Tracer:
    """This project's tracer: from the provider `setup` installed, else the global one."""
    if _provider is not None:
        return _provider.get_tracer(TRACER_NAME)  # type: ignore[no-any-return]
    return trace.get_tracer(TRACER_NAME)


# --- W3C trace context <-> strings --------------------------------------------------------------


def context_of(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The remote context a ``traceparent`` names; None when absent or invalid."""
    if not traceparent:
        return None
    return _parsed(traceparent, tracestate or None)


@functools.lru_cache(maxsize=4096)
def _parsed(traceparent: str, tracestate: str | None) -> Context | None:
    """`context_of`, kept for the latest few thousand contexts (a context cannot be changed):
    a burst's failure is parsed as its handling starts and again as its decision, published
    in its context, is framed."""
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    ctx = _PROPAGATOR.extract(carrier)
    span_ctx = trace.get_current_span(ctx).get_span_context()
    return ctx if span_ctx.is_valid else None


def traceparent_of(ctx: Context | None = None) -> tuple[str, str | None] | None:
    """(traceparent, tracestate) of ``ctx`` (default: the current context); None if no span."""
    span_ctx = trace.get_current_span(ctx).get_span_context()
    if not span_ctx.is_valid:
        return None
    # What the W3C propagator's inject writes, formatted here (every event a handler builds
    # asks, and inject wanted a context built around the span first).
    traceparent = f"00-{span_ctx.trace_id:032x}-{span_ctx.span_id:016x}-{span_ctx.trace_flags:02x}"
    state = span_ctx.trace_state.to_header() if span_ctx.trace_state else None
    return traceparent, state


def current_traceparent() -> tuple[str, str | None] | None:
    return traceparent_of(None)


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32-hex trace id in a ``traceparent`` (None when absent or malformed)."""
    ctx = context_of(traceparent)
    if ctx is None:
        return None
    return format(trace.get_current_span(ctx).get_span_context().trace_id, "032x")


def same_trace(a: str | None, b: str | None) -> bool:
    """Whether two ``traceparent`` values name the same trace (False if either has none)."""
    ta = trace_id_of(a)
    return ta is not None and ta == trace_id_of(b)


def event_attributes(event: Any) -> dict[str, Any]:
    """Span attributes naming an event and what it is about (job, checkpoint)."""
    data = event.data
    attrs: dict[str, Any] = {
        "ckpt_ha.event_type": event.event_type,
        "ckpt_ha.event_id": event.id,
        "ckpt_ha.job_id": data.job_id,
        "ckpt_ha.subject": event.subject,
    }
    checkpoint_id = getattr(data, "checkpoint_id", None)
    if checkpoint_id is not None:
        attrs["ckpt_ha.checkpoint_id"] = checkpoint_id
    reason = getattr(data, "reason", None)
    if isinstance(reason, str):
        attrs["ckpt_ha.reason"] = reason[:2000]
    return attrs


def link_to(traceparent: str | None, **attributes: Any) -> list[Link]:
    """A span link to the context ``traceparent`` names (empty when there is none)."""
    ctx = context_of(traceparent)
    if ctx is None:
        return []
    return [Link(trace.get_current_span(ctx).get_span_context(), attributes=attributes or None)]


# --- spans ----------------------------------------------------------------------------------


@contextlib.contextmanager
def span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: dict[str, Any] | None = None,
    links: list[Link] | None = None,
) -> Iterator[Span]:
    """A child of the current span; an exception marks it ERROR and propagates."""
    if not recording():
        yield trace.get_current_span()  # the no-op tracer's child: the same context
        return
    with tracer().start_as_current_span(
        name, kind=kind, attributes=clean_attributes(attributes), links=links
    ) as current:
        yield current


@contextlib.contextmanager
def continue_trace(
    name: str,
    traceparent: str | None,
    *,
    tracestate: str | None = None,
    attributes: dict[str, Any] | None = None,
    link_origin: bool = True,
) -> Iterator[Span]:
    """A span in the trace ``traceparent`` names (its child), linked to the current span.

    For work about a checkpoint that is not caused by a message carrying its context (a scrub
    round, a retention pass, a restore plan read from the registry): the span joins the
    checkpoint's trace and keeps a link back to what triggered it (and, with ``link_origin``,
    an explicit link to the stored context too, for backends that show links rather than
    parents). Without a stored context it is a plain child of the current span.
    """
    stored = context_of(traceparent, tracestate)
    if not recording():  # no span: the context the no-op tracer would make current
        if stored is None:
            yield trace.get_current_span()
            return
        token = otel_context.attach(stored)
        try:
            yield trace.get_current_span()
        finally:
            otel_context.detach(token)
        return
    if stored is None:
        with span(name, attributes=attributes) as current:
            yield current
        return
    trigger = trace.get_current_span().get_span_context()
    links = [Link(trigger, attributes={"ckpt_ha.link": "trigger"})] if trigger.is_valid else []
    if link_origin:
        links.extend(link_to(traceparent, **{"ckpt_ha.link": "checkpoint"}))
    with tracer().start_as_current_span(
        name, context=stored, attributes=clean_attributes(attributes), links=links
    ) as current:
        yield current


class Scope:
    """`continue_trace` for one unit of work whose steps are interleaved with other units'
    (a burst's failures, decided together a step at a time): its span is opened at the first
    `entered` (as `continue_trace` opens it: in the stored trace, linked to the span current
    then), made current again, never opened anew, at each later one, and ended by `end`.
    Without a recording provider it is the stored context, parsed once, made current at each
    entry (nothing current changes when there is none). An exception leaving an entry marks
    the span ERROR, as `continue_trace` does."""

    def __init__(
        self,
        name: str,
        traceparent: str | None,
        *,
        tracestate: str | None = None,
        attributes: dict[str, Any] | None = None,
        link_origin: bool = True,
    ) -> None:
        self._name = name
        self._traceparent, self._tracestate = traceparent, tracestate
        self._attributes, self._link_origin = attributes, link_origin
        self._opened = False
        self._ctx: Context | None = None
        """What each entry makes current (None: nothing)."""
        self._span: Span | None = None

    def _open(self) -> None:
        self._opened = True
        stored = context_of(self._traceparent, self._tracestate)
        if not recording():
            self._ctx = stored
            return
        links: list[Link] | None = None
        if stored is not None:
            trigger = trace.get_current_span().get_span_context()
            links = []
            if trigger.is_valid:
                links.append(Link(trigger, attributes={"ckpt_ha.link": "trigger"}))
            if self._link_origin:
                links.extend(link_to(self._traceparent, **{"ckpt_ha.link": "checkpoint"}))
        self._span = tracer().start_span(
            self._name, context=stored, attributes=clean_attributes(self._attributes), links=links
        )
        self._ctx = trace.set_span_in_context(self._span, stored)

    @contextlib.contextmanager
    def entered(self) -> Iterator[Span]:
        if not self._opened:
            self._open()
        if self._ctx is None:
            yield trace.get_current_span()
            return
        token = otel_context.attach(self._ctx)
        try:
            yield trace.get_current_span()
        except Exception as exc:
            if self._span is not None and self._span.is_recording():
                self._span.record_exception(exc)
                self._span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            otel_context.detach(token)

    def end(self) -> None:
        """The span ends (once; nothing when it was never entered or nothing records)."""
        if self._span is not None:
            self._span.end()
            self._span = None


@contextlib.contextmanager
def in_context(traceparent: str | None, tracestate: str | None = None) -> Iterator[None]:
    """Make the context ``traceparent`` names current when no span is (else change nothing)."""
    ctx = context_of(traceparent, tracestate)
    if ctx is None or trace.get_current_span().get_span_context().is_valid:
        yield
        return
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


def fail(reason: str, *, code: str | None = None, current: Span | None = None) -> None:
    """Mark the current span ERROR with ``reason`` (status description, event, attribute)."""
    target = current or trace.get_current_span()
    if not target.is_recording():
        return
    target.set_status(Status(StatusCode.ERROR, reason[:500]))
    attrs = {"ckpt_ha.reason": reason[:2000]}
    if code is not None:
        attrs["ckpt_ha.error_code"] = code
    target.set_attributes(attrs)
    target.add_event("ckpt_ha.failure", attrs)


def annotate(**attributes: Any) -> None:
    """Attributes on the current span (``None`` values left out)."""
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(clean_attributes(attributes) or {})


def clean_attributes(attributes: dict[str, Any] | None) -> dict[str, Any] | None:
    if not attributes:
        return None
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, str | bool | int | float) else str(value)
    return out
