"""Two replicas of every service on one stack (real NATS, Redis, S3 on moto, ten processes).

Three jobs write checkpoints while both replicas of each service run; one job fails, announced
twice (two event ids, as a runner retrying past the duplicate window would) so that both
coordinators may take it at once; once it is planned, one replica of each service is SIGKILLed
mid-flow (the holder of the periodic loops' leases, where there is one) while the other two jobs
write on. At the end:

* every checkpoint ends valid, none lost, stuck or doubled (`tests.system.faults.tally`);
* the stream holds exactly one ``checkpoint.verified`` and one ``checkpoint.registered`` per
  checkpoint, and one ``resume.planned`` for the failure;
* both replicas of each consumer service took part of the deliveries (their own /metrics);
* each periodic loop ran on one replica at a time, and the survivor took over the killed one's.

Prints ``REPLICAS <service>: ...`` lines with the figures (deliveries per replica, loops held).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import CheckpointState as S
from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.job import FailureCauseV1, JobFailedV1
from ckpt_ha.lab.devstack import procs, stack
from ckpt_ha.lab.devstack.procs import ManagedProcess
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime import local_stack
from ckpt_ha.runtime.catalog import SERVICE_NAMES
from ckpt_ha.sdk.checkpoints import process_environment
from tests.support.bus_tools import wait_for
from tests.system.faults.flows import (
    announce_start,
    dead_letters,
    job_for,
    now,
    plans_per_failure,
    settle,
    stop_writer,
)
from tests.system.faults.stack import FaultStack, running_stack
from tests.system.faults.tally import job_events
from tests.system.faults.writer import CheckpointWriter

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

JOBS = 3
EVERY_S = 0.4
"""Each job saves a checkpoint this often: about 7 a second in all."""
VALID_BEFORE_KILL = 15
SAVES = 48
"""Checkpoints written in all (about a third before the kill)."""

WORK: dict[str, str] = {
    "integrity-checker": "committed",
    "registrar": "checkpoints",
    "restore-coordinator": "registered",
    "retention-janitor": "registered",
}
"""The consumer whose deliveries show each replica's share of a service's work."""
LOOPS: dict[str, int] = {
    "writer-watcher": 1,
    "integrity-checker": 1,
    "retention-janitor": 1,
    "restore-coordinator": 1,
}
"""Periodic loops per service in this stack (the fault stack runs no scrub and no copies: the
checker's is its reconcile loop; the coordinator's is its lost-attempt watch)."""


def scrape(proc: ManagedProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One replica's /metrics: (sample name, labels) → value."""
    url = f"http://127.0.0.1:{proc.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def acked(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], durable: str) -> int:
    return int(
        sum(
            v
            for (name, labels), v in metrics.items()
            if name == "ckpt_ha_messages_total"
            and dict(labels).get("consumer") == durable
            and dict(labels).get("outcome") == "ack"
        )
    )


def loops_led(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> list[str]:
    return sorted(
        dict(labels)["loop"]
        for (name, labels), v in metrics.items()
        if name == "ckpt_ha_loop_leader" and v == 1
    )


def per_checkpoint(events: Sequence[Envelope[EventData]], event_type: str) -> Counter[str]:
    """Messages of ``event_type`` in the stream per checkpoint (a repeat past JetStream's
    duplicate window would be a second message)."""
    return Counter(
        str(e.data.__dict__["checkpoint_id"]) for e in events if e.event_type == event_type
    )


def second_replicas(fs: FaultStack) -> list[ManagedProcess]:
    """Replica ``b`` of every service, beside the ``up`` one (its own HTTP port and log),
    started side by side."""
    state = fs.state()

    def start(name: str) -> ManagedProcess:
        env = {**fs.env(), **local_stack.login_env(state, name)}
        return stack.start_service(name, fs.home, env, replica="b")

    with ThreadPoolExecutor(len(SERVICE_NAMES)) as pool:
        return list(pool.map(start, SERVICE_NAMES))


async def announce_failure(fs: FaultStack, job: str) -> None:
    """Attempt 1 of ``job`` failed (node exit), announced twice under two event ids."""
    bus = Bus(local_stack.bus_config(fs.state()), "replicas-runner")
    await bus.broker.start()
    try:
        data = JobFailedV1(
            job_id=job,
            run_id="run-1",
            attempt=1,
            cause=FailureCauseV1.NODE_EXIT,
            signal=9,
            signature="node_exit:9",
            side=FailureSide.INFRASTRUCTURE,
        )
        at = datetime.now(UTC)
        await asyncio.gather(
            *(
                bus.publish(build(data, source="ckpt-ha/runner", time=at, key=key))
                for key in ("failure", "failure-retried")
            )
        )
    finally:
        await bus.broker.stop()


async def test_two_replicas_of_each_service_split_the_work_and_survive_a_kill(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    with running_stack(tmp_path / "home") as fs:
        phases = {"stack_up": time.monotonic() - started}
        extra = second_replicas(fs)
        phases["replicas_up"] = time.monotonic() - started
        try:
            await _scenario(fs, extra, started, phases)
        finally:
            for proc in extra:
                procs.stop(proc, timeout=15)


async def _scenario(
    fs: FaultStack, extra: list[ManagedProcess], started: float, phases: dict[str, float]
) -> None:
    replicas = {
        name: [fs.service(name), next(p for p in extra if p.marker == f"serve {name}")]
        for name in SERVICE_NAMES
    }
    registry = Registry.from_url(fs.redis_url)
    jobs = [job_for(f"replicas{i}") for i in range(JOBS)]
    letters = await dead_letters(fs)
    # The environment the writer's checkpoints record (this process's), so that the failure is
    # restorable (R14) and planned rather than escalated.
    environment = process_environment(frozenset({"numpy"}), None)
    for job in jobs:
        await announce_start(fs, job, environment=environment)
    writers = [CheckpointWriter(fs, job, every_s=EVERY_S).start() for job in jobs]

    async def enough_valid() -> bool:
        found = [await registry.by_job(job, state=S.VALID) for job in jobs]
        return sum(len(records) for records in found) >= VALID_BEFORE_KILL

    def saved() -> int:
        return sum(len(w.committed_and_failed()) for w in writers)

    async def enough_saves() -> bool:
        return saved() >= SAVES

    try:
        await wait_for(enough_valid, timeout=60, what=f"{VALID_BEFORE_KILL} valid checkpoints")
        # The first job fails (it writes no more): both coordinators run, one plan.
        # At once: its last commit may not be registered yet, and the plan waits for it (a
        # commit handled after the plan of its attempt's failure would be fenced).
        await stop_writer(writers[0])
        await announce_failure(fs, jobs[0])

        async def plan() -> list[Envelope[EventData]]:
            found = await job_events(local_stack.bus_config(fs.state()), jobs[:1])
            return [e for e in found if e.event_type == "resume.planned"]

        await wait_for(plan, timeout=30, what="the resume plan")

        async def one_loop_holder_each() -> bool:
            held = {p.name: loops_led(scrape(p)) for name in LOOPS for p in replicas[name]}
            return all(
                sum(len(held[p.name]) for p in replicas[name]) == n for name, n in LOOPS.items()
            )

        await wait_for(one_loop_holder_each, timeout=15, what="one holder per loop")
        phases["kill"] = time.monotonic() - started
        before = {p.name: scrape(p) for ps in replicas.values() for p in ps}
        # The victim of each service: the holder of its loops if it has any, else replica a.
        victims = {
            name: next((p for p in ps if loops_led(before[p.name])), ps[0])
            for name, ps in replicas.items()
        }
        for proc in victims.values():
            procs.kill(proc)
        killed_at = saved()
        survivors = {
            name: next(p for p in ps if p is not victims[name]) for name, ps in replicas.items()
        }

        async def taken_over() -> bool:
            return all(len(loops_led(scrape(survivors[name]))) == n for name, n in LOOPS.items())

        t_kill = time.monotonic()
        await wait_for(taken_over, timeout=20, what="the survivors running every loop")
        takeover_s = time.monotonic() - t_kill
        await wait_for(enough_saves, timeout=60, what=f"{SAVES} saves")
    finally:
        for w in writers:
            await stop_writer(w)  # a stopped one returns at once
    saves = [s for w in writers for s in w.committed_and_failed()]
    phases["written"] = time.monotonic() - started
    figures = await settle(
        fs, registry, "replicas", jobs, saves, ended=now(), letters_before=letters, bound_s=60
    )
    events = await job_events(local_stack.bus_config(fs.state()), jobs)
    after = {p.name: scrape(p) for p in survivors.values()}
    await registry.close()

    verified = per_checkpoint(events, "checkpoint.verified")
    registered = per_checkpoint(events, "checkpoint.registered")
    planned = [e for e in events if e.event_type == "resume.planned"]
    committed = {s.checkpoint_id for s in saves if s.committed}
    durables = {name: f"{name}--{consumer}" for name, consumer in WORK.items()}
    # Each replica's deliveries: until the kill (both), and in all (the survivor's, at the end).
    share = {
        name: {p.name: acked(before[p.name], durable) for p in replicas[name]}
        for name, durable in durables.items()
    }
    total = {
        name: {
            p.name: acked(after[p.name] if p is survivors[name] else before[p.name], durable)
            for p in replicas[name]
        }
        for name, durable in durables.items()
    }
    took = time.monotonic() - started
    phases["settled"] = took
    print(figures.line(), f"new_dead_letters={figures.evidence['new_dead_letters']}")
    print("REPLICAS events", figures.evidence["events"])
    for e in planned:
        print("REPLICAS plan", e.data.__dict__["plan_id"], e.data.__dict__["checkpoint_id"])
    print(
        f"REPLICAS checkpoints={len(committed)} killed_after={killed_at} saves "
        f"verified_once={sum(1 for n in verified.values() if n == 1)} "
        f"registered_once={sum(1 for n in registered.values() if n == 1)} "
        f"plans={len(planned)} takeover_s={takeover_s:.1f} duration_s={took:.1f}"
    )
    print("REPLICAS phases (s since start)", {k: round(v, 1) for k, v in phases.items()})
    for name in SERVICE_NAMES:
        loops = {p.name: loops_led(before[p.name]) for p in replicas[name]}
        print(
            f"REPLICAS {name}: deliveries before the kill {share.get(name, '-')} "
            f"in all {total.get(name, '-')} loops before the kill {loops} "
            f"killed {victims[name].name}:{victims[name].pid} "
            f"survivor loops {loops_led(after[survivors[name].name])}"
        )

    assert (figures.lost, figures.stuck, figures.doubled) == (0, 0, 0), figures.evidence
    assert figures.evidence["new_dead_letters"] == 0, figures.evidence
    assert figures.valid == len(committed) >= SAVES - JOBS, figures.evidence
    assert set(verified) == committed, verified
    assert set(verified.values()) == {1}, verified
    assert set(registered) == committed, registered
    assert set(registered.values()) == {1}, registered
    assert len(planned) == 1, planned
    assert not plans_per_failure(events), planned
    for name, per in share.items():
        assert all(n > 0 for n in per.values()), f"{name}: one replica did nothing: {per}"
