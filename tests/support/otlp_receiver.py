"""Real OTLP trace receivers for tests: OTLP/HTTP (``POST /v1/traces``, protobuf bodies) and
OTLP/gRPC (the ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` method).

Both decode what the services' exporters send with opentelemetry-proto (the gRPC one serves the
TraceService servicer generated in that package, over grpcio), exactly as a collector would, and
keep every span with its resource's ``service.name``.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import (
    TraceServiceServicer,
    add_TraceServiceServicer_to_server,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    events: tuple[tuple[str, dict[str, Any]], ...]
    links: tuple[tuple[str, str], ...]
    """(trace id, span id) of each link."""

    @property
    def error(self) -> bool:
        return self.status_code == STATUS_ERROR


@dataclass
class OtlpReceiver:
    port: int = 0
    protocol: str = "http/protobuf"
    """What ``OTEL_EXPORTER_OTLP_PROTOCOL`` a client sets to reach it."""
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.add_request(request)

    def add_request(self, request: ExportTraceServiceRequest) -> None:
        received: list[ReceivedSpan] = []
        for rs in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            service = str(resource.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    received.append(
                        ReceivedSpan(
                            service=service,
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            attributes={kv.key: _value(kv.value) for kv in s.attributes},
                            status_code=s.status.code,
                            status_message=s.status.message,
                            events=tuple(
                                (e.name, {kv.key: _value(kv.value) for kv in e.attributes})
                                for e in s.events
                            ),
                            links=tuple((lk.trace_id.hex(), lk.span_id.hex()) for lk in s.links),
                        )
                    )
        with self._lock:
            self.spans.extend(received)
            self.requests += 1

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], Any], timeout: float, what: str
    ) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            result = found(self.snapshot())
            if result:
                return result
            if time.monotonic() > deadline:
                services = sorted({(s.service, s.name) for s in self.snapshot()})
                raise AssertionError(f"timed out waiting for {what}; received {services}")
            time.sleep(0.2)


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            try:
                receiver.add(body)
            except Exception:  # noqa: BLE001 - a bad body is the client's error
                self.send_response(400)
                self.end_headers()
                return
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def start_receiver() -> tuple[OtlpReceiver, Callable[[], None]]:
    receiver = OtlpReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return receiver, stop


class _TraceService(TraceServiceServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(  # noqa: N802 - the generated servicer's method name
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        self.receiver.add_request(request)
        return ExportTraceServiceResponse()


def start_grpc_receiver() -> tuple[OtlpReceiver, Callable[[], None]]:
    """An OTLP/gRPC receiver on a free loopback port (plaintext, as ``http://`` tells the
    exporter)."""
    import grpc

    receiver = OtlpReceiver(protocol="grpc")
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    add_TraceServiceServicer_to_server(_TraceService(receiver), server)
    receiver.port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    def stop() -> None:
        server.stop(grace=1).wait(5)

    return receiver, stop


def traces_by_id(spans: list[ReceivedSpan]) -> Iterator[tuple[str, list[ReceivedSpan]]]:
    by_trace: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    yield from by_trace.items()
