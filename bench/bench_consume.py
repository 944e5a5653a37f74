"""Consume → registry transition → ack rate of the registrar, against a bare JetStream loop.

Both read the same N events from the same stream on the same nats-server, in the same run:

* bare:      nats-py durable pull consumer, fetch batches, ack each message (no decoding, no work),
             in a fresh interpreter: nats-py as released, without the workarounds a `Bus`
             installs (`ckpt_ha.bus.compat`; ``--patched-bare`` also times this loop with them,
             for reference)
* registrar: the real registrar consumer (admission with the job signature check, decode,
  location check, Redis transition, explicit ack)

The streams are private to the run and provisioned as an operator does (``ckpt-ha streams
provision``: services never create them). The events are ``checkpoint.committed`` signed as the
SDK signs them (the job's key derived from the master key) at locations under each job's own
folder of a scratch storage root, so the registrar does its real work: every one must end up
``pending_verification``, and the run prints how many were dead-lettered (must be 0).

Prints both rates and their ratio for each round, then the median ratio. With ``--replicas 2``
it instead runs the registrar as one, then two separate processes on one stream each time and
prints both rates, their ratio and how many events each replica handled. Replicas share one
durable pull consumer (``registrar--checkpoints``): JetStream gives each fetch to whichever
replica pulls, so the work splits by batch; each process keeps its own batches in order, and
across replicas the registry's compare-and-set and its wait for an earlier event
(``DependencyNotReady``, nak'ed) keep a checkpoint's events in order. A second replica only adds
throughput when a core is free for it: the run prints each replica's CPU per event, the share of
a core it got, how busy the whole machine was, and the most the machine's cores allow
(`ceiling`: its CPU per event with one replica, servers included, against the cores).
``--profile FILE`` profiles the in-process registrar (cProfile) and writes the 60 most
expensive functions by cumulative and by own time, and the callers of the 15 most expensive by
own time, to ``FILE``; cProfile's figures for calls that release the GIL are wall time, so
``--stages`` instead prints the thread CPU per event of each synchronous step of the
registrar's path (`STAGES`; not with ``--replicas``). Usage:
    .venv/bin/python bench/bench_consume.py [--events 10000] [--rounds 3] [--batch 256]
        [--replicas 2] [--profile bench/profiles/registrar-after.txt] [--patched-bare] [--stages]
        [--nats URL] [--redis URL]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import functools
import importlib
import io
import multiprocessing as mp
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aioredis
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from pydantic import SecretStr

from ckpt_ha.bus import streams
from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat
from ckpt_ha.registrar.app import build as build_registrar
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.runtime import heap
from ckpt_ha.storage import open_store

SIGNING_KEY = "5e" * 32
"""The run's master key: the producer signs each job's events with that job's derived key."""
JOBS = 50


async def publish_events(bus: Bus, root: str, n: int) -> None:
    store = open_store(root)
    now = datetime.now(UTC)
    pending = []
    for i in range(n):
        job = f"job-{i % JOBS}"
        event = build(
            CheckpointCommittedV1(
                job_id=job,
                checkpoint_id=f"ck-{i}",
                uri=store.uri(f"{job}/step-{i}"),  # under the job's own folder of the root
                run_id="run-1",
                step=i,
                format=CheckpointFormat.NATIVE,
                shard_count=8,
                total_bytes=1 << 30,
            ),
            source="bench",
            time=now,
            key=str(i),
        )
        pending.append(bus.publish(event))  # signed: the bus holds the master key
        if len(pending) >= 500:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)


async def bare_rate(url: str, stream: str, subject: str, n: int, batch: int) -> float:
    """The bare loop's rate, run in a fresh interpreter (its CPU per event printed): nats-py as
    released, without the workarounds a `Bus` installs into this process (`ckpt_ha.bus.compat`,
    among them a cheaper hand-over of fetched messages), so the target's reference is the
    library as anyone gets it."""
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_bare_child, args=(url, stream, subject, n, batch, theirs))
    proc.start()
    theirs.close()
    rate, cpu = await asyncio.to_thread(mine.recv)
    await asyncio.to_thread(proc.join)
    print(f"  bare CPU per event: {1e6 * cpu / n:.0f} µs (nats-py as released)")
    BARE_CPU.append(cpu / n)
    return float(rate)


BARE_CPU: list[float] = []
"""CPU seconds per event of each bare run, for benches that report it."""


def _bare_child(url: str, stream: str, subject: str, n: int, batch: int, out: Any) -> None:
    from nats.aio.subscription import Subscription

    assert not hasattr(Subscription.next_msg, "__wrapped__"), "nats-py is not as released"
    out.send(asyncio.run(_bare_loop(url, stream, subject, n, batch)))


async def _bare_loop(
    url: str, stream: str, subject: str, n: int, batch: int, *, durable: str = "bench-bare"
) -> tuple[float, float]:
    """(rate, CPU seconds) of a durable pull consumer fetching batches and acking each message."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        subject,
        durable=durable,
        stream=stream,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_deliver=5),
    )
    got = 0
    start, cpu = time.perf_counter(), time.process_time()
    while got < n:
        msgs = await sub.fetch(batch, timeout=5)
        for m in msgs:
            await m.ack()
        got += len(msgs)
    await nc.flush()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    await nc.close()
    return n / elapsed, cpu


async def wait_projected(settings: RegistrarSettings, n: int) -> None:
    r = aioredis.Redis.from_url(settings.redis_url)
    key = f"{settings.registry_prefix}:state:pending_verification"
    try:
        while await r.scard(key) < n:  # noqa: ASYNC110 - light polling of Redis, not an event
            await asyncio.sleep(0.02)
    finally:
        await r.aclose()


STAGES = (
    ("ckpt_ha.bus.compat", "header_lines"),
    ("ckpt_ha.bus.admission", "admit"),
    ("ckpt_ha.contracts.envelope", "EventCatalog.decode"),
    ("ckpt_ha.contracts.framing", "verify"),
    ("ckpt_ha.core.records", "project_batch"),
    ("ckpt_ha.registry.projection", "write_batch"),
    ("ckpt_ha.registrar.handlers", "RegistrarHandlers._observe"),
    ("ckpt_ha.registrar.handlers", "RegistrarHandlers._quiet"),
)
"""Synchronous steps of the registrar's path that ``--stages`` times (admission holds the
envelope's decode and the signature check; the event loop, nats-py and Redis calls are the
rest of the CPU per event)."""


class Stages:
    """Thread CPU spent inside each of `STAGES`: every one wrapped in place (in each loaded
    module that imported it by name, for a function). A wrapped call costs about 1.3 µs more
    (measured here), which a step holding another one (admission) counts too."""

    def __init__(self) -> None:
        self.cpu: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def install(self) -> None:
        for module_name, qualname in STAGES:
            owner: Any = importlib.import_module(module_name)
            *path, name = qualname.split(".")
            for part in path:
                owner = getattr(owner, part)
            raw = vars(owner)[name]
            static = isinstance(raw, staticmethod)
            fn = raw.__func__ if static else raw
            timed = self._timed(qualname, fn)
            setattr(owner, name, staticmethod(timed) if static else timed)
            if not path:  # a function: also where it was imported by name
                for module in list(sys.modules.values()):
                    if getattr(module, name, None) is fn:
                        setattr(module, name, timed)

    def _timed(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[label] += time.thread_time_ns() - started
                self.calls[label] += 1

        return timed

    def report(self, events: int) -> None:
        """Print each step's CPU per event, then start counting afresh."""
        for _, label in STAGES:
            print(
                f"  stage {label}: {self.cpu[label] / 1e3 / events:.1f} µs per event"
                f" ({self.calls[label]} calls)"
            )
        self.cpu.clear()
        self.calls.clear()


async def registrar_rate(
    settings: RegistrarSettings, n: int, profile: Path | None, stages: Stages | None = None
) -> float:
    svc = build_registrar(settings)
    assert svc.registry.keys.state("pending_verification") == (
        f"{settings.registry_prefix}:state:pending_verification"
    )
    heap.settle()  # as `Service.run` does before it serves (not profiled)
    profiler = cProfile.Profile() if profile is not None else None
    if profiler is not None:
        profiler.enable()
    await svc.bus.broker.start()  # like the bare loop, timing starts once subscribed
    start, cpu = time.perf_counter(), time.process_time()
    await wait_projected(settings, n)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    print(f"  registrar CPU per event: {1e6 * cpu / n:.0f} µs (this process, load-independent)")
    if stages is not None:
        stages.report(n)
    if profiler is not None:
        profiler.disable()
        write_profile(profiler, profile, n, elapsed)  # type: ignore[arg-type]
    await svc.bus.broker.stop()
    await svc.registry.close()
    return n / elapsed


PROFILE_TOP = 60
PROFILE_CALLERS = 15


def write_profile(profiler: cProfile.Profile, path: Path, n: int, elapsed: float) -> None:
    out = io.StringIO()
    out.write(f"registrar consuming {n} events in {elapsed:.2f}s ({n / elapsed:.0f}/s)\n")
    for order in ("cumulative", "tottime"):
        out.write(f"\n=== top {PROFILE_TOP} by {order} ===\n")
        pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(order).print_stats(PROFILE_TOP)
    # Who calls the most expensive functions (by own time): where the cost comes from.
    stats = pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime")
    out.write(f"\n=== callers of the top {PROFILE_CALLERS} by tottime ===\n")
    stats.print_callers(PROFILE_CALLERS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out.getvalue())
    if os.environ.get("BENCH_PROFILE_RAW"):
        profiler.dump_stats(os.environ["BENCH_PROFILE_RAW"])
    print(f"profile written to {path}")


def private_names(kind: str = "") -> dict[str, str]:
    """A run's own subject prefix, streams and registry prefix, under a random tag: a bench
    shares the machine's NATS and Redis with tests and other benches (``kind`` tells which
    bench made them)."""
    tag, k = uuid.uuid4().hex[:8], kind.upper()
    return {
        "subject_prefix": f"bench{kind}{tag}",
        "events_stream": f"BENCH{k}_{tag}",
        "dead_letter_stream": f"BENCH{k}DLQ_{tag}",
        "progress_stream": f"BENCH{k}PR_{tag}",
        "registry_prefix": f"bench-{kind}:{tag}" if kind else f"bench:{tag}",
    }


@contextlib.asynccontextmanager
async def provisioned(url: str, cfg: BusConfig) -> AsyncIterator[JetStreamContext]:
    """The run's streams provisioned as the operator does (`streams.provision`), deleted at the
    end; yields the JetStream context."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await streams.provision(js, cfg)
        yield js
    finally:
        for stream in (cfg.events_stream, cfg.dead_letter_stream, cfg.progress_stream):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(stream)
        await nc.close()


def run_settings(args: argparse.Namespace, root: str, **extra: Any) -> RegistrarSettings:
    return RegistrarSettings(
        NATS_URL=args.nats,
        REDIS_URL=args.redis,
        fetch_batch=args.batch,
        projection_batch=args.batch,
        signing_key=SecretStr(SIGNING_KEY),
        storage_root=root,
        **private_names(),
        **extra,
    )


@contextlib.asynccontextmanager
async def private_streams(settings: RegistrarSettings, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Provision the run's streams as the operator does, publish the events, then clean up."""
    try:
        async with provisioned(args.nats, settings.bus()) as js:
            producer = Bus(settings.bus(), "bench-producer")
            await producer.broker.start()
            try:
                await publish_events(producer, settings.storage_root, args.events)
                yield js
            finally:
                await producer.broker.stop()
    finally:
        r = aioredis.Redis.from_url(args.redis)
        keys = [k async for k in r.scan_iter(match=f"{settings.registry_prefix}:*")]
        if keys:
            await r.delete(*keys)
        await r.aclose()


async def dead_lettered(js: Any, settings: RegistrarSettings) -> int:
    info = await js.stream_info(settings.dead_letter_stream)
    return int(info.state.messages)


async def one_round(
    args: argparse.Namespace, root: str, profile: Path | None
) -> tuple[float, float]:
    """One fresh stream, N events, read once by each consumer: (bare rate, registrar rate)."""
    settings = run_settings(args, root)
    async with private_streams(settings, args) as js:
        bare = await bare_rate(
            args.nats,
            settings.events_stream,
            f"{settings.subject_prefix}.ev.checkpoint.>",
            args.events,
            args.batch,
        )
        service = await registrar_rate(settings, args.events, profile, args.stages)
        dead = await dead_lettered(js, settings)
        if args.patched_bare:
            # For reference only: the same bare loop in this process, where building a Bus
            # installed ckpt-ha's nats-py workarounds (`ckpt_ha.bus.compat`).
            rate, cpu = await _bare_loop(
                args.nats,
                settings.events_stream,
                f"{settings.subject_prefix}.ev.checkpoint.>",
                args.events,
                args.batch,
                durable="bench-bare-patched",
            )
            print(
                f"  bare loop on nats-py with ckpt-ha's workarounds: {rate:.0f} msg/s, "
                f"CPU per event {1e6 * cpu / args.events:.0f} µs (reference, not the target's)"
            )
    print(f"  dead-lettered: {dead}")
    return bare, service


# --- replicas: the registrar as separate processes on one stream ------------------------------


def replica_main(settings: RegistrarSettings, n: int, out: Any, go: Any) -> None:
    """A registrar process: start, count its own acks until the registry holds all N."""
    import logging

    logging.disable(logging.INFO)
    out.send(asyncio.run(_replica(settings, n, go)))


async def _replica(settings: RegistrarSettings, n: int, go: Any) -> tuple[int, float, float, float]:
    svc = build_registrar(settings)
    seen = {"acks": 0, "first": 0.0, "last": 0.0}
    counted = svc.bus.dead_letters.on_outcome

    def on_outcome(consumer: str, outcome: str) -> None:
        counted(consumer, outcome)
        if outcome == "ack":
            now = time.time()
            seen["first"] = seen["first"] or now
            seen["last"] = now
            seen["acks"] += 1

    svc.bus.dead_letters.on_outcome = on_outcome
    go.wait()  # every replica connects at once
    heap.settle()  # as `Service.run` does before it serves
    cpu = time.process_time()
    await svc.bus.broker.start()
    await wait_projected(settings, n)
    cpu = time.process_time() - cpu
    await svc.bus.broker.stop()
    await svc.registry.close()
    return int(seen["acks"]), seen["first"], seen["last"], cpu


def cpu_ticks(pid: int) -> int:
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    return 0


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores so far (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def server_pids() -> dict[str, int]:
    found = {}
    for name in ("nats-server", "redis-server"):
        out = subprocess.run(["pgrep", "-o", "-x", name], capture_output=True, text=True).stdout
        if out.strip():
            found[name] = int(out.split()[0])
    return found


async def replicas_round(
    args: argparse.Namespace, root: str, k: int
) -> tuple[float, list[int], float]:
    """N events on a fresh stream, consumed by ``k`` registrar processes: (rate, acks each, the
    whole machine's CPU seconds per event: replicas, servers and everything else running)."""
    settings = run_settings(args, root)
    ctx = mp.get_context("spawn")
    async with private_streams(settings, args) as js:
        go = ctx.Event()
        pipes, procs = [], []
        for _ in range(k):
            mine, theirs = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=replica_main,
                args=(settings, args.events, theirs, go),
            )
            proc.start()
            theirs.close()  # a replica that dies then ends our recv (EOFError), not a hang
            pipes.append(mine)
            procs.append(proc)
        await asyncio.sleep(2.0)  # let the interpreters import
        servers = server_pids()
        ticks = {name: cpu_ticks(pid) for name, pid in servers.items()}
        machine = machine_ticks()
        wall = time.perf_counter()
        go.set()
        results = [await asyncio.to_thread(p.recv) for p in pipes]
        wall = time.perf_counter() - wall
        busy_now, total_now = machine_ticks()
        for proc in procs:
            proc.join()
        dead = await dead_lettered(js, settings)
    hz = os.sysconf("SC_CLK_TCK")
    busy = ", ".join(
        f"{name} {100 * (cpu_ticks(pid) - ticks[name]) / hz / wall:.0f}% of a core"
        for name, pid in servers.items()
    )
    first = min(r[1] for r in results if r[0])
    last = max(r[2] for r in results if r[0])
    acks = [r[0] for r in results]
    rate = sum(acks) / (last - first)
    cpu = ", ".join(f"{1e6 * r[3] / max(r[0], 1):.0f}" for r in results)
    got = ", ".join(f"{100 * r[3] / max(r[2] - r[1], 1e-9):.0f}%" for r in results)
    used = 100 * (busy_now - machine[0]) / max(total_now - machine[1], 1)
    per_event = (busy_now - machine[0]) / hz / max(sum(acks), 1)
    print(
        f"  {k} replica(s): {rate:8.0f} ev/s, handled {acks}, dead-lettered {dead}; "
        f"CPU per event each (µs): {cpu}; each replica got {got} of a core; {busy}; "
        f"machine {used:.0f}% busy (all {os.cpu_count()} cores, every process), "
        f"{1e6 * per_event:.0f} µs of machine CPU per event"
    )
    return rate, acks, per_event


def ceiling(one_rate: float, per_event: float, cores: int, k: int) -> float:
    """The most ``k`` replicas can reach against one on ``cores`` cores, if every event costs the
    machine what it cost with one replica (replicas, nats-server, redis-server): the cores run
    out at ``cores / per_event`` events a second. A second replica never makes an event
    cheaper for the servers, so this bounds the ratio from above."""
    return min(float(k), cores / per_event / one_rate)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument(
        "--batch",
        type=int,
        default=256,
        help="fetch batch size, the same for both (256: the registrar's default projection_batch)",
    )
    ap.add_argument("--replicas", type=int, default=0, help="compare 1 and N registrar processes")
    ap.add_argument("--profile", type=Path, default=None, help="cProfile the registrar (round 1)")
    ap.add_argument(
        "--patched-bare",
        action="store_true",
        help="also time the bare loop on nats-py with ckpt-ha's workarounds (for reference)",
    )
    ap.add_argument(
        "--stages",
        action="store_const",
        const=Stages(),
        help="print the thread CPU per event of each synchronous step of the registrar's path",
    )
    args = ap.parse_args()
    if args.stages is not None:
        args.stages.install()
    with tempfile.TemporaryDirectory(prefix="bench-root-") as root:
        if args.replicas:
            await replicas_main(args, root)
            return
        print(f"events per round: {args.events}, fetch batch {args.batch}, rounds {args.rounds}")
        ratios = []
        for i in range(1, args.rounds + 1):
            bare, service = await one_round(args, root, args.profile if i == 1 else None)
            ratios.append(service / bare)
            print(
                f"round {i}: bare nats-py consume+ack {bare:8.0f} msg/s | "
                f"registrar consume→transition→ack {service:8.0f} msg/s | "
                f"ratio {service / bare:.2f}"
            )
        print(f"median ratio registrar/bare: {statistics.median(ratios):.2f}  (target >= 0.5)")


async def replicas_main(args: argparse.Namespace, root: str) -> None:
    print(
        f"events per round: {args.events}, fetch batch {args.batch}, rounds {args.rounds}, "
        f"1 vs {args.replicas} registrar processes, {os.cpu_count()} cores"
    )
    ratios, ceilings = [], []
    cores = len(os.sched_getaffinity(0))
    for i in range(1, args.rounds + 1):
        print(f"round {i}:")
        one, _, per_event = await replicas_round(args, root, 1)
        many, _, _ = await replicas_round(args, root, args.replicas)
        ratios.append(many / one)
        ceilings.append(ceiling(one, per_event, cores, args.replicas))
        print(
            f"  ratio {args.replicas}/1: {many / one:.2f}; the {cores} cores allow at most "
            f"{ceilings[-1]:.2f} ({1e6 * per_event:.0f} µs of machine CPU per event at "
            f"{one:.0f} ev/s with one replica)"
        )
    print(
        f"median ratio {args.replicas} replicas / 1: {statistics.median(ratios):.2f}"
        f"  (target >= 1.7; median ceiling on {cores} cores: {statistics.median(ceilings):.2f})"
    )


if __name__ == "__main__":
    import logging

    logging.disable(logging.INFO)
    asyncio.run(main())
