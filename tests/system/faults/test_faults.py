"""The fault suite: real writers against the five real service processes, one fault at a time.

Each test starts a job writing checkpoints, injects its fault, waits for the system to converge
and records ``FAULT <name>: written=N valid=N lost=0 doubled=0 stuck=0 converge_s=T.T``
(see `tests.system.faults.tally` for what is counted). They share one stack (`conftest.fault_stack`)
and run in this file's order; the stream purge comes last, as it re-creates the event stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from dataclasses import replace
from datetime import timedelta

import nats
import pytest
from nats.aio.msg import Msg

from ckpt_ha.contracts.checkpoint import CheckpointState as S
from ckpt_ha.contracts.subjects import parse_event_subject
from ckpt_ha.formats import native
from ckpt_ha.lab.drill.assess import assess_restore
from ckpt_ha.lab.drill.harness import Drill, policy, progress_at_least, resumed_after, valid_count
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.redis_registry import Registry
from tests.support.bus_tools import publish_raw, stream_messages, wait_for
from tests.support.registry_snapshot import TRANSIENT, Key, differences, snapshot
from tests.system.faults.book import FigureBook
from tests.system.faults.flows import (
    CONVERGE_BOUND_S,
    ShiftedClock,
    announce_start,
    capture_stream,
    dead_letters,
    in_flight,
    janitor_ahead,
    job_for,
    now,
    plans_per_failure,
    quiet,
    saves_of,
    settle,
    stop_writer,
    tier_recorded,
    valid_at_least,
)
from tests.system.faults.stack import FaultStack
from tests.system.faults.tally import Figures, lost_keys
from tests.system.faults.writer import CheckpointWriter

pytestmark = pytest.mark.faults

DOWN_S = 4.0
"""How long a killed service (or nats-server) stays dead while the writer goes on."""
REDIS_FROZEN_S = 120.0
WRITERS_OF_THE_REGISTRY = ("registrar", "restore-coordinator", "retention-janitor")
"""What the runbook stops before a rebuild: the services writing under the registry prefix."""
NATS_OUTAGE_S = 180.0


TRAINING = ["--steps", "60", "--checkpoint-every", "10", "--sleep-per-step", "0.05"]
"""The drills' example job (numpy MLP), short: a checkpoint every 10 steps."""


async def kill_mid_flow(
    fs: FaultStack,
    registry: Registry,
    figures: FigureBook,
    name: str,
    *services: str,
    start_while_down: bool = False,
) -> None:
    """SIGKILL ``services`` while the writer's checkpoints are in flight, leave them dead for
    `DOWN_S` while it writes on, start them again (`up`). The job's start (declaring its tier)
    is published before the kill, or while the services are dead."""
    job = job_for(name)
    letters = await dead_letters(fs)
    if not start_while_down:
        await announce_start(fs, job)
    writer = CheckpointWriter(fs, job).start()
    try:
        await valid_at_least(registry, job, 2)
        mid_flow = await in_flight(registry, job)
        fs.kill(*services)
        if start_while_down:
            await announce_start(fs, job)
        await asyncio.sleep(DOWN_S)
        fs.up()
    finally:
        saves = await stop_writer(writer)
    ended = now()
    result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
    result.evidence["killed_mid_flow"] = mid_flow
    await tier_recorded(registry, job, "standard", result)
    figures.record(result)


@pytest.mark.timeout(240)
async def test_sigkill_writer_watcher(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    await kill_mid_flow(fault_stack, registry, figures, "sigkill-writer-watcher", "writer-watcher")


@pytest.mark.timeout(240)
async def test_sigkill_integrity_checker(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    await kill_mid_flow(
        fault_stack, registry, figures, "sigkill-integrity-checker", "integrity-checker"
    )


@pytest.mark.timeout(240)
async def test_sigkill_registrar(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    await kill_mid_flow(fault_stack, registry, figures, "sigkill-registrar", "registrar")


@pytest.mark.timeout(240)
async def test_sigkill_retention_janitor(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """The job's start (its declared tier) is published while the janitor is dead."""
    await kill_mid_flow(
        fault_stack, registry, figures, "sigkill-retention-janitor", "retention-janitor",
        start_while_down=True,
    )  # fmt: skip


@pytest.mark.timeout(300)
async def test_sigkill_restore_coordinator(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """A training job under `ckpt-ha run` dies while the coordinator is dead: the failure waits
    on the stream, and is planned once when the coordinator is back; the job resumes from its
    last valid checkpoint, exactly, and finishes."""
    fs, name = fault_stack, "sigkill-restore-coordinator"
    job = job_for(name)
    drill = Drill(fs.home, fs.state(), job, budget_s=240, log=print, scenario=name)
    letters = await dead_letters(fs)
    try:
        drill.launch(policy(), TRAINING, fs.writer_env())
        valid = await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")
        newest = max(r.step or 0 for r in valid)
        await drill.until(lambda: progress_at_least(drill, newest + 3), "training to go on")
        fs.kill("restore-coordinator")
        fault = await drill.kill_training()
        await asyncio.sleep(DOWN_S)
        fs.up()
        ended = now()
        await drill.until(lambda: resumed_after(drill, fault), "the resume verdict")
        code = await drill.wait_exit()
    finally:
        drill.stop()
    events = await drill.events()
    result = await settle(
        fs, registry, name, [job], saves_of(fs, events), ended=ended, letters_before=letters
    )
    for why in plans_per_failure(events):
        result.double(why)
    restore = assess_restore(name, events, job, fault)
    result.evidence["restore"] = {"verdict": restore.verdict, "reasons": restore.reasons}
    figures.record(result)
    assert code == 0, drill.runner_log
    assert restore.verdict == "pass", restore.reasons


@pytest.mark.timeout(240)
async def test_sigkill_registrar_and_integrity_checker(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    await kill_mid_flow(
        fault_stack, registry, figures, "sigkill-registrar+integrity-checker",
        "registrar", "integrity-checker",
    )  # fmt: skip


# -- deliveries --------------------------------------------------------------------------------


@pytest.mark.timeout(240)
async def test_duplicated_and_reordered_deliveries(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """Every event of a job delivered again, twice, newest first (past JetStream's dedupe: no
    message id), signed as the job signs; then fresh checkpoints whose only announcements arrive
    out of order (``committed`` before ``writing``, newest checkpoint first, each twice) while
    the watcher is stopped. Each checkpoint must end valid with each transition applied once."""
    fs, name = fault_stack, "duplicated-and-reordered-deliveries"
    job = job_for(name)
    letters = await dead_letters(fs)
    await announce_start(fs, job)
    writer = CheckpointWriter(fs, job).start()
    try:
        await valid_at_least(registry, job, 4)
    finally:
        first = await stop_writer(writer)
    await settle(fs, registry, name, [job], first, ended=now())
    delivered = [m for m in await stream_messages(fs.nats_url, "CKPT_EVENTS")
                 if (a := parse_event_subject("ckpt", m.subject)) and a.job_id == job]  # fmt: skip
    assert delivered
    for msg in reversed(delivered * 2):
        await publish_raw(fs.nats_url, msg.subject, msg.data)

    # Fresh checkpoints, announced on a capture subject only, then delivered out of order.
    fs.stop("writer-watcher")
    async with capture_stream(fs, "cap") as captured:
        later = CheckpointWriter(fs, job, prefix="cap", first_step=writer.next_step)
        fresh = [await asyncio.to_thread(later.save_one) for _ in range(3)]
        assert all(s.committed for s in fresh), [s.error for s in fresh]
        held = await captured()
    assert held, "no announcement was held back"
    for msg in out_of_order(held) * 2:
        await publish_raw(fs.nats_url, "ckpt." + msg.subject.removeprefix("cap."), msg.data)
    fs.up()
    ended = now()
    result = await settle(
        fs, registry, name, [job], [*first, *fresh], ended=ended, letters_before=letters
    )
    result.evidence["redelivered"] = 2 * len(delivered) + 2 * len(held)
    await tier_recorded(registry, job, "standard", result)
    figures.record(result)
    assert result.evidence["new_dead_letters"] == 0


def registry_losses(
    result: Figures, before: dict[str, Key], after: dict[str, Key], what: str
) -> None:
    """Each registry fact (`lost_keys`) that differs between two snapshots is lost."""
    diffs = differences(before, after, expiry_slack_s=60)
    by_key = {_differing_key(d): d for d in diffs}
    for key in lost_keys(by_key):
        result.lose(f"{what} {key}: {_where_they_part(by_key[key])}")
    result.evidence["keys_compared"] = len(before)
    result.evidence["keys_differing"] = len(diffs)


def _where_they_part(diff: str) -> str:
    """A `differences` line shortened to where its before and after values part (their first
    differing character, with some context), or its start when it is no such line."""
    parts = diff.split("\n  before ", 1)
    if len(parts) != 2 or "\n  after  " not in parts[1]:
        return diff[:300]
    before, after = parts[1].split("\n  after  ", 1)
    at = next((i for i, (b, a) in enumerate(zip(before, after, strict=False)) if b != a), 0)
    lo = max(0, at - 120)
    return f"{parts[0]} … before …{before[lo : at + 160]}… after …{after[lo : at + 160]}…"


def _differing_key(diff: str) -> str:
    """The key a `differences` line is about (``missing K: …``, ``value of K:…``)."""
    head = diff.split(":\n", 1)[0]
    for lead in ("missing ", "extra ", "value of ", "expiry of "):
        if head.startswith(lead):
            return head[len(lead) :].split(": ", 1)[0]
    return head


def out_of_order(msgs: list[Msg]) -> list[Msg]:
    """Newest checkpoint first, and each one's ``committed`` before its ``writing``."""

    def order(msg: Msg) -> tuple[int, bool]:
        return int(json.loads(msg.data)["data"]["step"]), ".committed." in msg.subject

    return sorted(msgs, key=order, reverse=True)


# -- NATS and Redis ------------------------------------------------------------------------------


@pytest.mark.timeout(240)
async def test_nats_sigkill_restarted_on_the_same_port(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """nats-server SIGKILLed mid-flow and started again on its port with its JetStream store:
    every service reconnects by itself; what was announced while it was down is announced again
    by the watcher from storage."""
    fs, name = fault_stack, "nats-sigkill"
    job = job_for(name)
    letters = await dead_letters(fs)
    await announce_start(fs, job)
    writer = CheckpointWriter(fs, job).start()
    try:
        await valid_at_least(registry, job, 2)
        mid_flow = await in_flight(registry, job)
        fs.kill_nats()
        await asyncio.sleep(DOWN_S)
        fs.start_nats()
    finally:
        saves = await stop_writer(writer)
    ended = now()
    result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
    result.evidence["killed_mid_flow"] = mid_flow
    await tier_recorded(registry, job, "standard", result)
    figures.record(result)


# -- storage -----------------------------------------------------------------------------------
#
# S3 (a moto server) behind two `TcpLink`s: the services' and the writers'. Cutting a link resets
# its connections and refuses new ones: the S3 endpoint is gone for the clients behind it. A trip
# wire starts the outage at the first request of the operation under test (the manifest's
# upload, a move to quarantine/, a DELETE), so the fault hits that operation, not a quiet moment.
# Each outage lasts OUTAGE_S, longer than every retry budget: a handler's (max_deliver x
# backoff, ~4 s here, each try with boto3's own 3 attempts) and the watcher's stall timeout (8 s).

OUTAGE_S = 20.0


async def outage(fs: FaultStack, tripped: threading.Event, what: str) -> None:
    """Wait for the trip wire, cut every link for `OUTAGE_S`, restore them."""
    assert await asyncio.to_thread(tripped.wait, 60), f"storage was never asked to {what}"
    fs.services_link.cut()
    fs.writer_link.cut()
    await asyncio.sleep(OUTAGE_S)
    fs.services_link.restore()
    fs.writer_link.restore()


@pytest.mark.timeout(240)
async def test_storage_down_during_write(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """Storage goes away as a save uploads its manifest: the checkpoint stays half written. It
    must be declared failed (never valid); the saves before are valid."""
    fs, name = fault_stack, "storage-down-during-write"
    job = job_for(name)
    letters = await dead_letters(fs)
    writer = CheckpointWriter(fs, job, every_s=0.5).start()
    try:
        await valid_at_least(registry, job, 2)
        tripped = fs.writer_link.trip_on(native.MANIFEST.encode())
        await outage(fs, tripped, "store a manifest")
    finally:
        saves = await stop_writer(writer)
    ended = now()
    result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
    figures.record(result)
    half_written = [s for s in saves if not s.committed]
    assert half_written, "no save was interrupted"
    assert result.evidence["states"].get("write_failed", 0) >= 1, result.evidence


@pytest.mark.timeout(240)
async def test_storage_down_during_verify(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """The services lose storage while the writer (whose storage path stays up) commits
    checkpoints: none can be verified until storage is back, for longer than the checker's
    retries; each must still end valid."""
    fs, name = fault_stack, "storage-down-during-verify"
    job = job_for(name)
    letters = await dead_letters(fs)
    writer = CheckpointWriter(fs, job, every_s=1.0).start()
    try:
        await valid_at_least(registry, job, 2)
        fs.services_link.cut()
        await asyncio.sleep(OUTAGE_S)
        fs.services_link.restore()
    finally:
        saves = await stop_writer(writer)
    ended = now()
    result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
    figures.record(result)


@pytest.mark.timeout(240)
async def test_storage_down_during_quarantine_move(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """A damaged checkpoint fails verification; storage goes away as the checker starts moving
    its bytes to quarantine/. It must still end quarantined (and never valid)."""
    fs, name = fault_stack, "storage-down-during-quarantine-move"
    job = job_for(name)
    letters = await dead_letters(fs)
    writer = CheckpointWriter(fs, job).start()
    try:
        await valid_at_least(registry, job, 2)
    finally:
        await stop_writer(writer)
    tripped = fs.services_link.trip_on(f"/quarantine/{job}/".encode())
    damaging = CheckpointWriter(fs, job, store=fs.damaging_store(), first_step=writer.next_step)
    bad = await asyncio.to_thread(damaging.save_one)
    assert bad.committed, bad.error
    await outage(fs, tripped, "move a checkpoint to quarantine")
    ended = now()
    saves = [*writer.committed_and_failed(), replace(bad, damaged=True)]
    result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
    figures.record(result)
    record = await registry.get(bad.checkpoint_id or "")
    assert record is not None
    assert record.quarantine_uri is not None, "the bytes were never moved to quarantine"


@pytest.mark.timeout(240)
async def test_storage_down_during_delete(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """Retention deletes the expired checkpoints of a job (its rounds on a clock two days
    ahead); storage goes away at the first DELETE and stays away for several rounds. Every
    expired checkpoint must end deleted with its bytes gone; the kept ones stay valid."""
    fs, name = fault_stack, "storage-down-during-delete"
    job = job_for(name)
    letters = await dead_letters(fs)
    writer = CheckpointWriter(fs, job).start()
    try:
        await valid_at_least(registry, job, 5)
    finally:
        saves = await stop_writer(writer)
    await settle(fs, registry, name, [job], saves, ended=now())  # all valid before retention
    clock = ShiftedClock()
    async with janitor_ahead(fs, clock) as janitor:
        clock.offset = timedelta(days=2)  # past the settle time: beyond keep-last expires
        expired = (await janitor.run_once([job])).expired
        assert len(expired) >= 2, "retention expired nothing"

        async def recorded() -> bool:
            return len(await registry.by_job(job, state=S.EXPIRED)) == len(expired)

        await wait_for(recorded, timeout=30, what="the expiries recorded")
        clock.offset = timedelta(days=2, hours=2)  # past the grace: deletion may start
        tripped = fs.services_link.trip_on(b"DELETE /")

        async def rounds() -> None:
            while True:
                await janitor.run_once([job])
                await asyncio.sleep(2.0)

        task = asyncio.create_task(rounds())
        try:
            await outage(fs, tripped, "delete an object")
            ended = now()
            want = {cid: frozenset({S.DELETED}) for cid in expired}
            result = await settle(
                fs, registry, name, [job], saves, ended=ended, letters_before=letters, want=want
            )
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    figures.record(result)
    store = fs.direct_store()
    for save in saves:
        if save.checkpoint_id in expired:
            assert not list(store.list(f"{save.folder}/")), f"{save.folder} still has bytes"


@pytest.mark.timeout(300)
async def test_redis_flushall_then_rebuild(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """Redis loses everything (FLUSHALL) under the running stack; the runbook's rebuild (stop
    the services that write the registry, `ckpt-ha registry rebuild --clear`, `ckpt-ha up`)
    must bring back every key that matters as it was: the records of every fault's jobs so far,
    declared and chosen tiers, an operator's pin, the coordinator's starts, plans, decisions and
    verdicts of the training job it resumed. Compared: every key under the
    registry prefix but the coordinator's leases; expiries within a minute."""
    fs, name = fault_stack, "redis-flushall-rebuild"
    job = job_for(name)
    letters = await dead_letters(fs)
    await announce_start(fs, job)
    writer = CheckpointWriter(fs, job).start()
    try:
        await valid_at_least(registry, job, 4)
    finally:
        saves = await stop_writer(writer)
    held = saves[0].checkpoint_id or ""
    pinned = fs.cli("pin", held, "--by", "eval:faults", "--reason", "held across the flush")
    assert pinned.returncode == 0, pinned.stderr
    chosen = fs.cli("tier", "set", "--job", job, "critical", "--reason", "a flush must keep this")
    assert chosen.returncode == 0, chosen.stderr
    await settle(fs, registry, name, [job], saves, ended=now())
    await quiet(fs)
    client = connect(fs.redis_url)
    try:
        before = await snapshot(client, "ckpt-ha", transient=TRANSIENT)
        fs.stop(*WRITERS_OF_THE_REGISTRY)
        await client.flushall()
        rebuilt = fs.cli("registry", "rebuild", "--clear", "--yes")
        fs.up()
        ended = now()
        result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
        await quiet(fs)
        after = await snapshot(client, "ckpt-ha", transient=TRANSIENT)
    finally:
        await client.aclose()
    registry_losses(result, before, after, "the rebuild did not bring back")
    result.evidence["rebuild"] = rebuilt.stdout.strip()[-300:] or rebuilt.stderr.strip()[-300:]
    await tier_recorded(registry, job, "critical", result)
    record = await registry.get(held)
    if record is None or not record.pins:
        result.lose(f"{held}: the operator's pin")
    figures.record(result)
    assert rebuilt.returncode == 0, rebuilt.stderr


@pytest.mark.timeout(420)
async def test_redis_frozen_for_two_minutes(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """redis-server stopped with SIGSTOP for 2 minutes (it keeps its sockets and answers
    nothing), then SIGCONT, while the writer goes on: no handler may hold its message for good,
    and every checkpoint written meanwhile must end valid."""
    fs, name = fault_stack, "redis-sigstop-120s"
    job = job_for(name)
    letters = await dead_letters(fs)
    await announce_start(fs, job)
    writer = CheckpointWriter(fs, job, every_s=1.0).start()
    try:
        await valid_at_least(registry, job, 2)
        mid_flow = await in_flight(registry, job)
        fs.pause_redis()
        try:
            await asyncio.sleep(REDIS_FROZEN_S)
        finally:
            fs.resume_redis()
    finally:
        saves = await stop_writer(writer)
    ended = now()
    result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
    result.evidence["frozen_mid_flow"] = mid_flow
    await tier_recorded(registry, job, "standard", result)
    figures.record(result)


@pytest.mark.timeout(480)
async def test_nats_outage_of_three_minutes(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """nats-server stopped for 3 minutes, then started on its port: longer than any client
    library's default reconnect budget. The services must reconnect by themselves (no restart)
    and announce what was written meanwhile."""
    fs, name = fault_stack, "nats-outage-180s"
    job = job_for(name)
    letters = await dead_letters(fs)
    await announce_start(fs, job)
    pids = {p.name: p.pid for p in fs.state().processes}
    writer = CheckpointWriter(fs, job, every_s=2.0).start()
    try:
        await valid_at_least(registry, job, 2)
        fs.stop_nats()
        await asyncio.sleep(NATS_OUTAGE_S)
        fs.start_nats()
    finally:
        saves = await stop_writer(writer)
    ended = now()
    result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
    await tier_recorded(registry, job, "standard", result)
    result.evidence["healthy_after"] = fs.healthy()
    figures.record(result)
    assert {p.name: p.pid for p in fs.state().processes} == pids, "a service was restarted"
    assert all(result.evidence["healthy_after"].values()), result.evidence["healthy_after"]


# -- the stream --------------------------------------------------------------------------------


@pytest.mark.timeout(300)
async def test_stream_purged_by_mistake_rebuild_refuses(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """The event stream is lost the way an operator could lose it (it refuses purges and message
    deletion): deleted, then provisioned again, empty, and the writer goes on writing into it.
    `ckpt-ha registry rebuild --clear` must refuse (its history is incomplete) and change
    nothing in the registry. Last in this file: it re-creates the stack's stream."""
    fs, name = fault_stack, "stream-purged"
    job = job_for(name)
    letters = await dead_letters(fs)
    await announce_start(fs, job)
    writer = CheckpointWriter(fs, job).start()
    try:
        await valid_at_least(registry, job, 3)
    finally:
        saves = await stop_writer(writer)
    await settle(fs, registry, name, [job], saves, ended=now())

    nc = await nats.connect(fs.nats_url)
    try:
        js = nc.jetstream()
        with pytest.raises(nats.js.errors.APIError):
            await js.purge_stream("CKPT_EVENTS")  # refused: the stream denies purges
        await js.delete_stream("CKPT_EVENTS")
    finally:
        await nc.close()
    provisioned = fs.cli("streams", "provision")
    assert provisioned.returncode == 0, provisioned.stderr
    later = CheckpointWriter(fs, job, first_step=writer.next_step)
    saves += [await asyncio.to_thread(later.save_one) for _ in range(2)]

    # The runbook's rebuild: the services that write the registry stopped, rebuild, start.
    fs.stop(*WRITERS_OF_THE_REGISTRY)
    client = connect(fs.redis_url)
    try:
        before = await snapshot(client, "ckpt-ha", transient=TRANSIENT)
        rebuilt = fs.cli("registry", "rebuild", "--clear", "--yes")
        after = await snapshot(client, "ckpt-ha", transient=TRANSIENT)
    finally:
        await client.aclose()
    fs.restart_all()  # every consumer again, on the new stream
    ended = now()
    # A rebuild that went ahead wiped what only the lost history held: nothing brings it back.
    bound = CONVERGE_BOUND_S if rebuilt.returncode != 0 else 15.0
    result = await settle(
        fs, registry, name, [job], saves, ended=ended, letters_before=letters, bound_s=bound
    )
    registry_losses(result, before, after, "the refused rebuild changed")
    result.evidence["rebuild"] = {"exit": rebuilt.returncode, "said": rebuilt.stderr.strip()[-300:]
                                  or rebuilt.stdout.strip()[-300:]}  # fmt: skip
    figures.record(result)
    assert rebuilt.returncode != 0, rebuilt.stdout
    assert "CKPT_EVENTS" in rebuilt.stderr, rebuilt.stderr
