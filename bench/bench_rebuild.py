"""``registry rebuild`` of a long event stream: time, rate, memory of the rebuilding process and
the size of what it leaves in Redis (the applied-id window above all).

A private nats-server and redis-server (started here, removed afterwards) so Redis's memory
is this registry's only. The stream is provisioned as the operator does
(`ckpt_ha.bus.streams.provision`) and filled with a realistic history: many jobs, each
checkpoint written, committed (both signed by their job), verified and registered; a job keeps
its last ``--keep`` checkpoints, so older ones are expired and deleted (tombstones); a new run
starts (``job.started``, signed) every ``--run-every`` checkpoints. The events' times spread
over the last ``--days`` days, as a real stream's would.

The rebuild runs in a child process (its peak RSS is the rebuild's alone, not the publisher's)
through `ckpt_ha.ops.rebuild.rebuild_registry`, the code behind ``ckpt-ha registry rebuild``.

``--job-commands``: then ``job list`` and ``job show`` (of one job) are answered both ways on
the rebuilt state, side by side (issue 33): before, by reading the whole stream (what the CLI
did, with its 2 s idle wait for the end of the stream); after, from the restore-coordinator's
job index, which the rebuild replayed. The answers are compared.

Usage:
    .venv/bin/python bench/bench_rebuild.py [--events 1000000] [--rounds 1] [--jobs 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import nats
from nats.js.api import StreamInfo
from nats.js.client import JetStreamContext
from pydantic import SecretStr

from ckpt_ha.bus import streams
from ckpt_ha.bus.admission import job_key
from ckpt_ha.contracts import Envelope, EventData, build, framing
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointFormat,
    CheckpointRegisteredV1,
    CheckpointVerifiedV1,
    CheckpointWritingV1,
)
from ckpt_ha.contracts.job import JobStartedV1
from ckpt_ha.lab.devstack import procs
from ckpt_ha.ops.rebuild import rebuild_registry
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import key_for_uri, open_store

EVENTS_PER_CHECKPOINT = 6
"""writing, committed, verified, registered, and later expired and deleted."""


def history(args: argparse.Namespace, root: str) -> Iterator[Envelope[EventData]]:
    """``args.events`` events, jobs interleaved, in time order."""
    for n, event in enumerate(_lifecycles(args, root)):
        if n == args.events:
            return
        yield event


def _lifecycles(args: argparse.Namespace, root: str) -> Iterator[Envelope[EventData]]:
    per_job = -(-args.events // (4 * args.jobs))  # enough: stopped at exactly args.events
    end = datetime.now(UTC) - timedelta(minutes=2)
    start = end - timedelta(days=args.days)
    per_event = (end - start) / args.events  # so the history ends about now
    emitted = 0
    for i in range(per_job):
        for j in range(args.jobs):
            job = f"job-{j:05d}"
            at = start + emitted * per_event
            run = f"run-{i // args.run_every + 1}"
            if i % args.run_every == 0:
                yield build(
                    JobStartedV1(job_id=job, run_id=run, attempt=1, tier="standard"),
                    source="runner",
                    time=at,
                    key=f"{job}/{run}",
                )
            ckpt, step = f"{job}-c{i}", (i + 1) * 100
            uri = f"file://{root}/{job}/step-{step}"
            common = {"job_id": job, "checkpoint_id": ckpt, "uri": uri}
            yield build(
                CheckpointWritingV1(**common, run_id=run, step=step),
                source="sdk",
                time=at,
                key="w",
            )
            yield build(
                CheckpointCommittedV1(
                    **common,
                    run_id=run,
                    step=step,
                    format=CheckpointFormat.NATIVE,
                    shard_count=8,
                    total_bytes=8 << 30,
                    metrics={"loss": 1.0 / (i + 1)},
                ),
                source="sdk",
                time=at + timedelta(seconds=30),
                key="c",
            )
            yield build(
                CheckpointVerifiedV1(**common, checks=("manifest", "sizes", "crc32c")),
                source="integrity-checker",
                time=at + timedelta(seconds=60),
                key="v",
            )
            yield build(
                CheckpointRegisteredV1(**common, step=step, tier="standard"),
                source="registrar",
                time=at + timedelta(seconds=61),
                key="r",
            )
            if i >= args.keep:
                old, old_step = f"{job}-c{i - args.keep}", (i - args.keep + 1) * 100
                gone = {
                    "job_id": job,
                    "checkpoint_id": old,
                    "uri": f"file://{root}/{job}/step-{old_step}",
                }
                yield build(
                    CheckpointExpiredV1(**gone, reason="keep-last", policy="standard"),
                    source="retention-janitor",
                    time=at + timedelta(seconds=62),
                    key="e",
                )
                yield build(
                    CheckpointDeletedV1(**gone, reason="keep-last", actor="retention-janitor"),
                    source="retention-janitor",
                    time=at + timedelta(seconds=63),
                    key="d",
                )
            emitted += 4 + (2 if i >= args.keep else 0) + (1 if i % args.run_every == 0 else 0)


async def publish(settings: ServiceSettings, args: argparse.Namespace) -> int:
    """Provision the streams as the operator does and publish the history (not acknowledged one
    by one: flushed every ``--in-flight`` messages and counted in the stream)."""
    cfg = settings.bus()
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    await streams.provision(js, cfg)
    n = 0
    for event in history(args, settings.storage_root):
        body, subject = event.to_bytes(), framing.subject(cfg.prefix, event)
        headers = framing.headers(event.id, subject, body, key=job_key(cfg, event))
        await nc.publish(subject, body, headers=headers)
        n += 1
        if n % args.in_flight == 0:
            # Not acknowledged one by one: the stream is counted once it holds them all.
            await nc.flush()
            await until_stored(js, cfg.events_stream, n - args.in_flight)
    await nc.flush()
    info = await until_stored(js, cfg.events_stream, n)
    await nc.close()
    if info.state.messages != n:
        raise SystemExit(f"published {n}, the stream holds {info.state.messages}")
    return n


async def until_stored(js: JetStreamContext, stream: str, n: int) -> StreamInfo:
    """Once the stream holds ``n`` messages (or stops growing for 10 s)."""
    last, since = -1, time.monotonic()
    while True:
        info = await js.stream_info(stream)
        if info.state.messages >= n or time.monotonic() - since > 10:
            return info
        if info.state.messages != last:
            last, since = info.state.messages, time.monotonic()
        await asyncio.sleep(0.05)


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


async def rebuild_child(settings: ServiceSettings) -> None:
    """The rebuild alone, in this (child) process: prints one JSON line of figures."""
    registry = Registry(
        connect(settings.redis()),
        settings.registry_prefix,
        applied_window_s=settings.applied_window_s,
    )
    samples: list[float] = []

    def progress(read: int, _total: int | None) -> None:
        if read % 50_000 == 0:
            samples.append(round(rss_mb(), 1))

    store = open_store(settings.storage_root)
    before = rss_mb()
    started = time.perf_counter()
    report = await rebuild_registry(
        registry, settings.bus(), partial(key_for_uri, store), clear=True, progress=progress
    )
    elapsed = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    info = await registry.r.info("memory")
    records = registry.keys.checkpoint("*")
    figures = {
        "report": report.to_json(),
        "elapsed_s": elapsed,
        "rss_before_mb": before,
        "rss_every_50k_mb": samples,
        "peak_rss_mb": peak_kb / 1024,
        "redis_used_memory": info["used_memory"],
        "applied_ids": await registry.r.zcard(registry.keys.applied),
        "records": len([k async for k in registry.r.scan_iter(match=records)]),
    }
    await registry.close()
    print(json.dumps(figures))


def settings_for(nats_url: str, redis_url: str, tag: str, root: str, key: str) -> ServiceSettings:
    return ServiceSettings(
        NATS_URL=nats_url,
        REDIS_URL=redis_url,
        subject_prefix=f"bench{tag}",
        events_stream=f"BENCH_REBUILD_{tag}",
        dead_letter_stream=f"BENCH_REBUILD_DLQ_{tag}",
        registry_prefix=f"bench:{tag}",
        storage_root=root,
        signing_key=SecretStr(key),
    )


def one_round(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    # The history is only read back: no fsync per stored message (the devstack's own setting,
    # a later block overrides it), or publishing a million takes longer than the rebuild.
    store = json.dumps(str(tmp / "nats-server" / "nats" / "js"))
    nats_proc = procs.start_nats(
        tmp / "nats-server",
        config_extra=f'jetstream {{\n  store_dir: {store}\n  sync_interval: "2m"\n}}',
    )
    redis_proc = procs.start_redis(tmp / "redis-server")
    tag, key = secrets.token_hex(4), secrets.token_hex(32)
    root = str(tmp / "storage")
    settings = settings_for(nats_proc.url, redis_proc.url, tag, root, key)
    try:
        started = time.perf_counter()
        n = asyncio.run(publish(settings, args))
        published_s = time.perf_counter() - started
        print(f"  published {n} events in {published_s:.0f} s ({n / published_s:.0f} events/s)")
        profile = ["-m", "cProfile", "-o", args.profile] if args.profile else []
        argv = [nats_proc.url, redis_proc.url, tag, root, key]
        child = subprocess.run(
            [sys.executable, *profile, __file__, "--child", *argv],
            check=True,
            capture_output=True,
            text=True,
        )
        figures: dict[str, object] = json.loads(child.stdout.strip().splitlines()[-1])
        figures["events"] = n
        if args.job_commands:
            figures["job_commands"] = asyncio.run(job_commands(settings))
        return figures
    finally:
        asyncio.run(delete_streams(settings))
        procs.stop(redis_proc)
        procs.stop(nats_proc)


async def job_commands(settings: ServiceSettings) -> dict[str, object]:
    """``job list`` and ``job show`` from the whole stream and from the job index, timed."""
    from ckpt_ha.bus.stream_reader import read_events
    from ckpt_ha.cli.jobs import _indexed
    from ckpt_ha.contracts import CATALOG
    from ckpt_ha.contracts.subjects import job_token
    from ckpt_ha.ops import jobs

    cfg = settings.bus()
    registry = Registry(connect(settings.redis()), settings.registry_prefix)
    t = time.perf_counter()
    everything, _ = await read_events(cfg, CATALOG, f"{cfg.prefix}.ev.>", idle_timeout=2.0)
    scanned = [s.to_json() for s in jobs.summaries(everything)]
    scan_list = time.perf_counter() - t
    del everything
    t = time.perf_counter()
    indexed = [s.to_json() for s in jobs.summaries(await _indexed(settings))]
    index_list = time.perf_counter() - t
    job = str(scanned[len(scanned) // 2]["job_id"])

    t = time.perf_counter()
    own, _ = await read_events(
        cfg, CATALOG, f"{cfg.prefix}.ev.*.*.*.{job_token(job)}", idle_timeout=2.0
    )
    before = jobs.show(job, own, await registry.by_job(job))
    scan_show = time.perf_counter() - t
    t = time.perf_counter()
    after = jobs.show(job, await _indexed(settings, [job]), await registry.by_job(job))
    index_show = time.perf_counter() - t
    await registry.close()
    return {
        "jobs": len(scanned),
        "list_scan_s": scan_list,
        "list_index_s": index_list,
        "show_scan_s": scan_show,
        "show_index_s": index_show,
        "list_equal": scanned == indexed,
        "show_equal": before is not None
        and after is not None
        and before.to_json() == after.to_json(),
    }


async def delete_streams(settings: ServiceSettings) -> None:
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    for stream in (settings.events_stream, settings.dead_letter_stream):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)
    await nc.close()


def show(i: int, f: dict[str, object]) -> None:
    report = f["report"]
    assert isinstance(report, dict)
    n, elapsed = int(str(f["events"])), float(str(f["elapsed_s"]))
    print(
        f"round {i}: rebuild of {n} events in {elapsed:.1f} s = {n / elapsed:.0f} events/s | "
        f"peak RSS {float(str(f['peak_rss_mb'])):.0f} MB "
        f"(at start {float(str(f['rss_before_mb'])):.0f} MB; every 50k events: "
        f"{f['rss_every_50k_mb']}) | redis used_memory "
        f"{int(str(f['redis_used_memory'])) / 2**20:.1f} MB | applied ids kept "
        f"{f['applied_ids']} | records {f['records']}"
    )
    print(
        f"  read {report['read']}, applied {report['applied']}, replayed {report['replayed']}, "
        f"duplicates {report['duplicates']}, skipped {report['skipped'] or 'none'}"
    )
    jc = f.get("job_commands")
    if isinstance(jc, dict):
        print(
            f"  job list ({jc['jobs']} jobs): whole stream {jc['list_scan_s']:.2f} s | job index "
            f"{jc['list_index_s']:.3f} s | same answer: {jc['list_equal']}"
        )
        print(
            f"  job show (one job): whole stream {jc['show_scan_s']:.2f} s | job index "
            f"{jc['show_index_s']:.3f} s | same answer: {jc['show_equal']}"
        )


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        nats_url, redis_url, tag, root, key = sys.argv[2:7]
        asyncio.run(rebuild_child(settings_for(nats_url, redis_url, tag, root, key)))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--keep", type=int, default=10, help="checkpoints a job keeps")
    ap.add_argument("--run-every", type=int, default=40, help="checkpoints per run")
    ap.add_argument("--days", type=float, default=30.0, help="how long the history spans")
    ap.add_argument("--in-flight", type=int, default=5000, help="publishes between checks")
    ap.add_argument("--profile", help="write a cProfile of the rebuild (child) to this file")
    ap.add_argument(
        "--job-commands",
        action="store_true",
        help="then time job list / job show from the whole stream and from the job index",
    )
    args = ap.parse_args()
    print(
        f"history: ~{args.events} events, {args.jobs} jobs, over {args.days:g} days; "
        f"private nats-server and redis-server; rounds {args.rounds}"
    )
    rates = []
    for i in range(1, args.rounds + 1):
        tmp = Path(tempfile.mkdtemp(prefix="bench-rebuild-"))
        try:
            figures = one_round(args, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        show(i, figures)
        rates.append(int(str(figures["events"])) / float(str(figures["elapsed_s"])))
    rates.sort()
    print(f"median rebuild rate: {rates[len(rates) // 2]:.0f} events/s")


if __name__ == "__main__":
    main()
