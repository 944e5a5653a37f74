"""One trace per checkpoint, across separate processes, collected by a real OTLP receiver.

writer-watcher, integrity-checker and registrar run as `ckpt-ha serve <name>` with only the
standard ``OTEL_*`` variables pointing their exporters at an OTLP receiver run by this test, once
over OTLP/HTTP and once over OTLP/gRPC (``OTEL_EXPORTER_OTLP_PROTOCOL``; protobuf decoded with
opentelemetry-proto, the gRPC one served by its generated TraceService servicer). A checkpoint
written to storage is announced by the watcher (the trace's root), verified by the checker and
registered by the registrar: all their spans about it share one trace id. A checkpoint corrupted
on write carries ERROR and the reason.

On S3 (moto's server), the checker's reads of the shards and the registrar's Redis commands are
child spans in the checkpoint's trace (OpenTelemetry's botocore and redis instrumentations).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest

from ckpt_ha import sdk
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.stack import start_service
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore, ObjectInfo, S3Store
from tests.support.bus_tools import wait_for
from tests.support.cli_tools import stack_env
from tests.support.damage import flip_last_byte
from tests.support.moto_server import aws_env, s3_client, start_moto_server
from tests.support.otlp_receiver import (
    OtlpReceiver,
    ReceivedSpan,
    start_grpc_receiver,
    start_receiver,
)

pytestmark = pytest.mark.e2e

SERVICES = ("registrar", "integrity-checker", "writer-watcher")
NAMES = {f"ckpt-ha-{s}" for s in SERVICES}


def service_env(settings: ServiceSettings, root: Path | str, otlp: OtlpReceiver) -> dict[str, str]:
    return {
        **stack_env(settings),
        "CKPT_HA_STORAGE_ROOT": str(root),
        "CKPT_HA_POLL_INTERVAL_S": "0.3",
        "CKPT_HA_ACK_WAIT_S": "5",
        "CKPT_HA_BACKOFF_S": "[0.2, 0.5, 1]",
        "CKPT_HA_GRACEFUL_TIMEOUT_S": "5",
        # The standard OpenTelemetry variables, nothing of our own.
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": otlp.protocol,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_SERVICE_NAME": "",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest) -> Iterator[OtlpReceiver]:
    rx, stop = start_grpc_receiver() if request.param == "grpc" else start_receiver()
    assert rx.protocol == request.param
    try:
        yield rx
    finally:
        stop()


def start_stack(tmp_path: Path, env: dict[str, str]) -> Iterator[tuple[procs.ManagedProcess, ...]]:
    started: list[procs.ManagedProcess] = []
    try:
        for name in SERVICES:
            started.append(start_service(name, tmp_path, env, timeout=60))
        yield tuple(started)
    finally:
        for proc in reversed(started):
            procs.stop(proc, timeout=15)
    leftovers = [p.name for p in started if procs.is_alive(p)]
    assert not leftovers, f"still running after stop: {leftovers}"


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    root = tmp_path / "storage"
    root.mkdir()
    return root


@pytest.fixture
def stack(
    settings: ServiceSettings, tmp_path: Path, storage: Path, receiver: OtlpReceiver
) -> Iterator[tuple[procs.ManagedProcess, ...]]:
    yield from start_stack(tmp_path, service_env(settings, storage, receiver))


class CorruptingStore(FsStore):
    """Storage that silently flips one byte of ``victim`` on write (same size)."""

    def __init__(self, root: Path, victim: str) -> None:
        super().__init__(root)
        self.victim = victim

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        if key.endswith(self.victim):
            data = flip_last_byte(data)
        return super().put(key, data, metadata=metadata)


VERIFIED_SPANS = frozenset(
    {("ckpt-ha-integrity-checker", "checkpoint.verify"),
     ("ckpt-ha-registrar", "registrar checkpoint.verified")}
)  # fmt: skip
"""The spans a verified checkpoint's trace must hold besides the watcher's."""


def about(spans: list[ReceivedSpan], checkpoint_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.attributes.get("ckpt_ha.checkpoint_id") == checkpoint_id]


def one_trace(
    spans: list[ReceivedSpan], checkpoint_id: str, need: frozenset[tuple[str, str]] = frozenset()
) -> list[ReceivedSpan] | None:
    """Every span of the one trace holding this checkpoint's spans from all three services, once
    the spans ``need`` names ((service, span name)) have arrived too: each service exports in
    batches, so one service's spans can arrive in several."""
    mine = about(spans, checkpoint_id)
    trace_ids = {s.trace_id for s in mine}
    if len(trace_ids) != 1:
        return None
    (trace_id,) = trace_ids
    trace = [s for s in spans if s.trace_id == trace_id]
    complete = {s.service for s in trace} >= NAMES and {(s.service, s.name) for s in trace} >= need
    return trace if complete else None


async def test_one_trace_per_checkpoint_across_processes(
    stack: tuple[procs.ManagedProcess, ...],
    settings: ServiceSettings,
    storage: Path,
    receiver: OtlpReceiver,
) -> None:
    registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
    weights = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    state = {"weights": weights, "optimizer": {"step": 1, "lr": 3e-4}}

    async def in_state(checkpoint_id: str, want: CheckpointState) -> CheckpointRecord | None:
        rec = await registry.get(checkpoint_id)
        return rec if rec is not None and rec.state is want else None

    try:
        # No bus: the writer-watcher announces it, so its span is the trace's root.
        good = await asyncio.to_thread(
            sdk.save, FsStore(storage), "job-tr", 10, state, run_id="run-1"
        )
        rec = await wait_for(
            lambda: in_state(good.checkpoint_id, CheckpointState.VALID),
            timeout=45,
            what="the checkpoint to become valid",
        )
        assert rec.traceparent is not None, "the registry stores the checkpoint's trace context"

        trace = await asyncio.to_thread(
            receiver.wait_for,
            lambda spans: one_trace(spans, good.checkpoint_id, VERIFIED_SPANS),
            30,
            "one trace with spans of all three services",
        )
        trace_id = trace[0].trace_id
        assert rec.traceparent.split("-")[1] == trace_id
        names = {(s.service, s.name) for s in trace}
        assert ("ckpt-ha-integrity-checker", "checkpoint.verify") in names, names
        assert ("ckpt-ha-registrar", "registrar checkpoint.verified") in names, names
        # The watcher's first announcement is the root; every other span has a parent.
        roots = [s for s in trace if not s.parent_span_id]
        assert len(roots) == 1, roots
        assert roots[0].service == "ckpt-ha-writer-watcher"
        assert roots[0].name.startswith("publish checkpoint.")
        # No span about this checkpoint landed in another trace.
        assert {s.trace_id for s in about(receiver.snapshot(), good.checkpoint_id)} == {trace_id}
        assert not [s for s in trace if s.error], [s for s in trace if s.error]

        # Corrupt on write: the checker's verdict span carries ERROR and the reason.
        bad = await asyncio.to_thread(
            sdk.save,
            CorruptingStore(storage, "state/weights.npy"),
            "job-tr",
            20,
            state,
            run_id="run-1",
        )
        await wait_for(
            lambda: in_state(bad.checkpoint_id, CheckpointState.QUARANTINED),
            timeout=45,
            what="the corrupt checkpoint quarantined",
        )

        def corrupt_trace(spans: list[ReceivedSpan]) -> list[ReceivedSpan] | None:
            trace = one_trace(spans, bad.checkpoint_id)
            if trace is None:
                return None
            names = {(s.service, s.name) for s in trace}
            done = ("ckpt-ha-registrar", "registrar checkpoint.quarantined") in names
            return trace if done else None

        bad_trace = await asyncio.to_thread(
            receiver.wait_for, corrupt_trace, 30, "the corrupt checkpoint's trace"
        )
        errors = [s for s in bad_trace if s.error]
        checker = [s for s in errors if s.service == "ckpt-ha-integrity-checker"]
        assert checker, [(s.service, s.name) for s in bad_trace]
        verdict = checker[0]
        assert "state/weights.npy: checksum" in verdict.status_message
        assert "state/weights.npy: checksum" in str(verdict.attributes["ckpt_ha.reason"])
        assert any(name == "ckpt_ha.failure" for name, _ in verdict.events)
        registrar = {s.name for s in errors if s.service == "ckpt-ha-registrar"}
        assert registrar >= {"registrar checkpoint.corrupt", "registrar checkpoint.quarantined"}
        assert all(procs.is_alive(p) for p in stack)
    finally:
        await registry.close()


# --- S3 and Redis calls as child spans ------------------------------------------------------


@pytest.fixture
def bucket() -> Iterator[tuple[str, str]]:
    """(moto's endpoint, a fresh bucket on it)."""
    endpoint, stop = start_moto_server()
    name = f"tr-{uuid.uuid4().hex[:12]}"
    try:
        s3_client(endpoint).create_bucket(Bucket=name)
        yield endpoint, name
    finally:
        stop()


@pytest.fixture
def grpc_receiver() -> Iterator[OtlpReceiver]:
    rx, stop = start_grpc_receiver()
    try:
        yield rx
    finally:
        stop()


@pytest.fixture
def s3_stack(
    settings: ServiceSettings,
    tmp_path: Path,
    bucket: tuple[str, str],
    grpc_receiver: OtlpReceiver,
) -> Iterator[tuple[procs.ManagedProcess, ...]]:
    endpoint, name = bucket
    env = {
        **service_env(settings, f"s3://{name}/checkpoints", grpc_receiver),
        **aws_env(endpoint),
    }
    yield from start_stack(tmp_path, env)


def descends_from(span: ReceivedSpan, ancestor: ReceivedSpan, trace: list[ReceivedSpan]) -> bool:
    by_id = {s.span_id: s for s in trace}
    parent = by_id.get(span.parent_span_id)
    while parent is not None:
        if parent.span_id == ancestor.span_id:
            return True
        parent = by_id.get(parent.parent_span_id)
    return False


def is_s3_call(span: ReceivedSpan) -> bool:
    return (
        span.attributes.get("rpc.system") == "aws-api"
        and span.attributes.get("rpc.service") == "S3"
    )


def is_redis_call(span: ReceivedSpan) -> bool:
    return "redis" in (span.attributes.get("db.system"), span.attributes.get("db.system.name"))


async def test_s3_and_redis_calls_are_child_spans_of_the_checkpoints_trace(
    s3_stack: tuple[procs.ManagedProcess, ...],
    settings: ServiceSettings,
    bucket: tuple[str, str],
    grpc_receiver: OtlpReceiver,
) -> None:
    endpoint, name = bucket
    registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
    store = S3Store(name, "checkpoints", client=s3_client(endpoint))
    state = {"weights": np.arange(256, dtype=np.float32), "optimizer": {"step": 1}}
    try:
        saved = await asyncio.to_thread(sdk.save, store, "job-s3tr", 10, state, run_id="run-1")

        async def valid() -> CheckpointRecord | None:
            rec = await registry.get(saved.checkpoint_id)
            return rec if rec is not None and rec.state is CheckpointState.VALID else None

        await wait_for(valid, timeout=45, what="the checkpoint on S3 to become valid")

        def children(spans: list[ReceivedSpan]) -> tuple[list[ReceivedSpan], ...] | None:
            trace = one_trace(spans, saved.checkpoint_id, VERIFIED_SPANS)
            if trace is None:
                return None
            verify = next(
                s
                for s in trace
                if (s.service, s.name) == ("ckpt-ha-integrity-checker", "checkpoint.verify")
            )
            registrar = next(
                s
                for s in trace
                if (s.service, s.name) == ("ckpt-ha-registrar", "registrar checkpoint.verified")
            )
            s3_reads = [s for s in trace if is_s3_call(s) and descends_from(s, verify, trace)]
            redis_calls = [
                s for s in trace if is_redis_call(s) and descends_from(s, registrar, trace)
            ]
            return (trace, s3_reads, redis_calls) if s3_reads and redis_calls else None

        trace, s3_reads, redis_calls = await asyncio.to_thread(
            grpc_receiver.wait_for,
            children,
            30,
            "S3 reads under checkpoint.verify and Redis commands under the registrar's span",
        )
        assert {s.service for s in s3_reads} == {"ckpt-ha-integrity-checker"}
        assert {s.attributes.get("rpc.method") for s in s3_reads} & {"GetObject", "HeadObject"}
        assert {s.service for s in redis_calls} == {"ckpt-ha-registrar"}
        # Only the watcher's announcement is a root: no client call started a trace of its own,
        # and no S3 or Redis span arrived outside a trace ckpt-ha started.
        roots = [s for s in trace if not s.parent_span_id]
        assert [s.service for s in roots] == ["ckpt-ha-writer-watcher"], roots
        received = grpc_receiver.snapshot()
        orphans = [
            s for s in received if (is_s3_call(s) or is_redis_call(s)) and not s.parent_span_id
        ]
        assert not orphans, [(s.service, s.name) for s in orphans[:5]]
    finally:
        await registry.close()
