"""Running one service process: the FastStream app, /metrics, /livez and /readyz, graceful SIGTERM.

``/livez`` says the process and its event loop answer; it never checks a dependency, so an
orchestrator does not restart a service that is only waiting for NATS or Redis (it reconnects by
itself). ``/readyz`` says the dependencies are reachable and the consumers started; ``/healthz``
is the same check under its older name (the local stack, `ckpt-ha status` and the runbook use it).

FastStream installs the SIGTERM/SIGINT handlers: on a signal it stops fetching, lets in-flight
handlers finish within the broker's graceful timeout, then drains the connection. A message whose
handler did not finish is neither acked nor lost: JetStream redelivers it after ``ack_wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from faststream import FastStream
from faststream.nats.prometheus.provider import (
    BatchNatsMetricsSettingsProvider,
    NatsMetricsSettingsProvider,
)
from faststream.prometheus import ConsumeAttrs, PrometheusMiddleware
from faststream.prometheus.container import MetricsContainer
from faststream.prometheus.manager import MetricsManager
from faststream.prometheus.types import PublishingStatus
from faststream.specification import AsyncAPI
from nats.aio.msg import Msg
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ckpt_ha.bus.broker import Bus, PublishObserver
from ckpt_ha.telemetry import logs
from ckpt_ha.telemetry.metrics import ServiceMetrics

log = logging.getLogger("ckpt_ha.runtime")

HealthCheck = Callable[[], Awaitable[bool]]
CHECK_TIMEOUT_S = 2.0
"""Bound on one health check (a frozen dependency answers nothing)."""


def make_app(bus: Bus, *, title: str, description: str) -> FastStream:
    """The FastStream app of a service; its AsyncAPI document is generated from it.

    Call it after every consumer is registered: it also subscribes to their max-deliveries
    advisories.
    """
    bus.watch_max_deliveries()
    spec = AsyncAPI(title=title, version="1", description=description)
    ours = logs.library_logger("ckpt_ha.app")
    if ours is None:
        return FastStream(bus.broker, specification=spec)
    return FastStream(bus.broker, specification=spec, logger=ours)


def bounded_subject(subject: str) -> str:
    """An event subject without its job token (``ckpt.ev.checkpoint.committed.v1.*``): the
    faststream metrics label messages by subject, which must not grow with the jobs."""
    head, dot, _ = subject.rpartition(".")
    return f"{head}.*" if ".ev." in subject and dot else subject


class _Provider(NatsMetricsSettingsProvider):
    def get_consume_attrs_from_message(self, msg: Any) -> ConsumeAttrs:
        attrs = super().get_consume_attrs_from_message(msg)
        attrs["destination_name"] = bounded_subject(attrs["destination_name"])
        return attrs

    def get_publish_destination_name_from_cmd(self, cmd: Any) -> str:
        return bounded_subject(super().get_publish_destination_name_from_cmd(cmd))


class _BatchProvider(BatchNatsMetricsSettingsProvider):
    def get_consume_attrs_from_message(self, msg: Any) -> ConsumeAttrs:
        attrs = super().get_consume_attrs_from_message(msg)
        attrs["destination_name"] = bounded_subject(attrs["destination_name"])
        return attrs

    def get_publish_destination_name_from_cmd(self, cmd: Any) -> str:
        return bounded_subject(super().get_publish_destination_name_from_cmd(cmd))


def _providers(msg: Any) -> _Provider | _BatchProvider | None:
    if isinstance(msg, Sequence):
        return _BatchProvider()
    if isinstance(msg, Msg) or msg is None:
        return _Provider()
    return None


def faststream_metrics(metrics: ServiceMetrics) -> PrometheusMiddleware[Any, Any]:
    """faststream's own message metrics (``faststream_received_messages_total``, durations,
    publishes, exceptions) in the service's registry: `NatsPrometheusMiddleware` with subjects
    labelled without their job token."""
    return PrometheusMiddleware(
        settings_provider_factory=_providers,
        registry=metrics.registry,
        app_name=metrics.service,
    )


def publish_metrics(metrics: ServiceMetrics) -> PublishObserver:
    """What `Bus.publish` reports each publish attempt to: faststream's publish metrics
    (``faststream_published_messages_total``, ``..._duration_seconds``,
    ``..._exceptions_total``) in the service's registry, under the labels its middleware
    gives them (the subject without its job token), now that the bus publishes on the
    JetStream client itself."""
    manager = MetricsManager(
        MetricsContainer(metrics.registry, custom_label_names=()), app_name=metrics.service
    )

    def observe(subject: str, seconds: float, error: BaseException | None) -> None:
        destination = bounded_subject(subject)
        if error is not None:
            manager.add_published_message_exception(
                broker="nats", destination=destination, exception_type=type(error).__name__
            )
        manager.observe_published_message_duration(
            duration=seconds, broker="nats", destination=destination
        )
        status = PublishingStatus.success if error is None else PublishingStatus.error
        manager.add_published_message(broker="nats", destination=destination, status=status)

    return observe


async def poll_consumers(bus: Bus, metrics: ServiceMetrics, interval_s: float) -> None:
    """Consumer lag for /metrics: JetStream's num_pending / num_ack_pending, and the streams'
    storage (`poll_streams`), every interval."""
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            try:
                for durable, pending, ack_pending, redelivered in await bus.consumer_info():
                    labels = (metrics.service, durable)
                    metrics.consumer_pending.labels(*labels).set(pending)
                    metrics.consumer_ack_pending.labels(*labels).set(ack_pending)
                    metrics.consumer_redelivered.labels(*labels).set(redelivered)
                    metrics.consumer_polled.labels(*labels).set_to_current_time()
            except Exception as exc:  # noqa: BLE001 - stale lag is shown by the timestamp
                log.warning("%s: consumer info unavailable: %r", metrics.service, exc)
            try:
                await poll_streams(bus, metrics)
            except Exception as exc:  # noqa: BLE001 - the last values stay; retried next round
                log.warning("%s: stream info unavailable: %r", metrics.service, exc)
            await asyncio.sleep(interval_s)


async def poll_streams(bus: Bus, metrics: ServiceMetrics) -> None:
    """JetStream storage for /metrics: the streams' size and limit, the account's usage."""
    for stream, messages, nbytes, max_bytes in await bus.stream_usage():
        metrics.stream_messages.labels(metrics.service, stream).set(messages)
        metrics.stream_bytes.labels(metrics.service, stream).set(nbytes)
        metrics.stream_max_bytes.labels(metrics.service, stream).set(max_bytes)
    used, limit = await bus.account_storage()
    metrics.jetstream_storage.labels(metrics.service).set(used)
    metrics.jetstream_storage_limit.labels(metrics.service).set(limit)


class HttpEndpoint:
    """Minimal HTTP/1.1 server for ``GET /metrics``, ``/livez``, ``/readyz`` and ``/healthz``
    (no framework needed).

    Not ready until `started` is set: `serve` sets it once the app's consumers run (a bare
    endpoint, as in tests, is ready from the start)."""

    def __init__(
        self, metrics: ServiceMetrics, checks: Mapping[str, HealthCheck], host: str, port: int
    ) -> None:
        self.metrics = metrics
        self.checks = checks
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._last: dict[str, bool] = {}
        self.started = True
        """Whether the consumers run (part of readiness, not of liveness)."""

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def health(self) -> tuple[bool, dict[str, bool]]:
        """Every check at once, each bounded; the results also set ``ckpt_ha_dependency_up``
        (a change is logged once, not on every check)."""

        async def one(check: HealthCheck) -> bool:
            try:
                return bool(await asyncio.wait_for(check(), timeout=CHECK_TIMEOUT_S))
            except Exception:  # noqa: BLE001 - a failing check is reported, not raised
                return False

        names = list(self.checks)
        found = await asyncio.gather(*(one(self.checks[name]) for name in names))
        results = dict(zip(names, found, strict=True))
        for name, ok in results.items():
            if self._last.get(name) is not ok and (name in self._last or not ok):
                (log.info if ok else log.warning)(
                    "%s: %s %s", self.metrics.service, name, "reachable" if ok else "UNREACHABLE"
                )
            self._last[name] = ok
            self.metrics.dependency_up.labels(self.metrics.service, name).set(1 if ok else 0)
        return all(results.values()), results

    async def watch(self, interval_s: float) -> None:
        """Run the checks every ``interval_s``, so the gauge tracks a lost connection even
        when nobody asks /healthz."""
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await self.health()
                await asyncio.sleep(interval_s)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), timeout=5.0)
            while (await asyncio.wait_for(reader.readline(), timeout=5.0)) not in (b"\r\n", b""):
                pass
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else "/"
            if path.startswith("/metrics"):
                status, ctype, body = (
                    200,
                    CONTENT_TYPE_LATEST,
                    generate_latest(self.metrics.registry),
                )
            elif path.startswith("/livez"):
                # Answered by the event loop that runs the handlers: a blocked loop answers nothing.
                status, ctype, body = 200, "application/json", b'{"ok": true}'
            elif path.startswith(("/readyz", "/healthz")):
                ok, results = await self.health()
                ok = ok and self.started
                status, ctype = (200 if ok else 503), "application/json"
                body = json.dumps({"ok": ok, "started": self.started, "checks": results}).encode()
            else:
                status, ctype, body = 404, "text/plain", b"not found\n"
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def serve(
    app: FastStream,
    bus: Bus,
    metrics: ServiceMetrics,
    *,
    host: str,
    port: int,
    extra_checks: Mapping[str, HealthCheck] | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    on_start: Callable[[], Awaitable[None]] | None = None,
    consumer_info_interval_s: float = 10.0,
    dependency_check_interval_s: float = 5.0,
) -> None:
    """Run until SIGTERM/SIGINT; the HTTP endpoint lives exactly as long as the app.

    /readyz (and /healthz) answers 503 until the consumers run and while NATS or another checked
    dependency (Redis) is unreachable, and ``ckpt_ha_dependency_up`` says which; /livez answers
    200 throughout, as the process keeps running and reconnecting meanwhile.
    """

    async def nats_ok() -> bool:
        return await bus.broker.ping(timeout=1.0)

    http = HttpEndpoint(metrics, {"nats": nats_ok, **(extra_checks or {})}, host, port)
    http.started = False
    poller: asyncio.Task[None] | None = None
    watcher: asyncio.Task[None] | None = None

    @app.on_startup
    async def _starting() -> None:
        # Before the broker connects: /livez answers while a service waits for NATS.
        bound = await http.start()
        log.info("%s: http on %s:%s (/metrics, /livez, /readyz)", metrics.service, host, bound)
        if on_start is not None:
            await on_start()

    @app.after_startup
    async def _started() -> None:
        nonlocal poller, watcher
        if bus.consumers:
            poller = asyncio.create_task(poll_consumers(bus, metrics, consumer_info_interval_s))
        watcher = asyncio.create_task(http.watch(dependency_check_interval_s))
        http.started = True
        metrics.up.labels(metrics.service).set(1)

    @app.on_shutdown
    async def _stopping() -> None:
        http.started = False  # no longer ready: a load balancer stops sending work first
        metrics.up.labels(metrics.service).set(0)
        for task in (poller, watcher):
            if task is not None:
                task.cancel()
        await http.stop()

    @app.after_shutdown
    async def _stopped() -> None:
        if on_stop is not None:
            await on_stop()

    await app.run()
