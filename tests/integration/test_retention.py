"""Retention against a real registrar, NATS, Redis and a real filesystem store, through the real
CLI process: every protection holds, tombstones are queryable, the dry run equals the real run, a
storage outage during deletion leaves a consistent state that a later round completes, pins and
tiers are recorded with actor and reason, reconcile reports and deletes only when told."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import CATALOG, build
from ckpt_ha.contracts.checkpoint import CheckpointCopyChangedV1, CheckpointState, CopyState
from ckpt_ha.contracts.job import JobPolicy, JobStartedV1
from ckpt_ha.contracts.resume import Compatibility, ResumeMode, ResumePlannedV2, ResumeVerifiedV1
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.ops.rebuild import rebuild
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.retention_janitor.app import build as build_janitor_app
from ckpt_ha.retention_janitor.domain import Action, ProtectionKind
from ckpt_ha.retention_janitor.handlers import Janitor, ResumesBehind, RoundResult
from ckpt_ha.retention_janitor.settings import RetentionJanitorSettings
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore, key_for_uri
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.cli_tools import cli
from tests.support.events import T0, committed, verified
from tests.support.janitor import rounds_janitor

pytestmark = pytest.mark.integration

JOB = "job-1"


class Clock:
    """The janitor's clock: real time plus an offset a test moves forward (past a grace)."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


@pytest.fixture
def store(tmp_path: Path) -> FsStore:
    root = tmp_path / "storage"
    root.mkdir()
    return FsStore(root)


@pytest.fixture
def settings(settings: ServiceSettings, store: FsStore) -> ServiceSettings:
    """The registrar's storage root is the store the test writes (a location must be its
    job's in that root)."""
    return settings.model_copy(update={"storage_root": str(store.root)})


@pytest.fixture
async def janitor(
    settings: ServiceSettings, registrar: Registrar, store: FsStore
) -> AsyncIterator[tuple[Janitor, Clock]]:
    """A janitor whose rounds the test runs (only the consumers of its view of resumes, so no
    round runs on its own)."""
    clock = Clock()
    async with rounds_janitor(settings, registrar.registry, store, clock) as jan:
        yield jan, clock


def env_for(store: FsStore) -> dict[str, str]:
    return {"CKPT_HA_STORAGE_ROOT": str(store.uri("x")[len("file://") : -len("/x")])}


async def write_valid(
    registrar: Registrar,
    producer: Bus,
    store: FsStore,
    step: int,
    job: str = JOB,
    project: str | None = None,
    traceparent: str | None = None,
    attempt: int | None = None,
) -> str:
    """Real bytes on storage, then committed + verified through the real registrar."""
    ckpt = f"{job}-c{step}"
    prefix = f"{job}/step-{step:06d}"
    store.put(f"{prefix}/shard-0.bin", b"x" * 100)
    store.put(f"{prefix}/manifest.json", b"{}")
    await producer.publish(
        committed(
            ckpt,
            job=job,
            step=step,
            uri=store.uri(prefix),
            project=project,
            traceparent=traceparent,
            attempt=attempt,
        )
    )
    await producer.publish(verified(ckpt, job=job, step=step))

    async def valid() -> bool:
        rec = await registrar.registry.get(ckpt)
        return rec is not None and rec.state is CheckpointState.VALID

    await wait_for(valid, what=f"{ckpt} valid")
    return ckpt


async def state_of(registrar: Registrar, ckpt: str, state: CheckpointState) -> CheckpointRecord:
    async def reached() -> CheckpointRecord | None:
        rec = await registrar.registry.get(ckpt)
        return rec if rec is not None and rec.state is state else None

    found = await wait_for(reached, what=f"{ckpt} {state.value}")
    assert isinstance(found, CheckpointRecord)
    return found


async def coordinator_references(
    producer: Bus, registrar: Registrar, jan: Janitor, ids: dict[str, str]
) -> None:
    """What the coordinator and the runner publish in production, through the janitor's own
    consumers: an earlier resume (verified) whose R15 fallback is still pinned, a plan whose
    attempt has not started, and a plan whose resumed attempt is running. The janitor reads
    none of the coordinator's keys (its Redis user could not)."""

    async def uri(ckpt: str) -> str:
        rec = await registrar.registry.get(ckpt)
        assert rec is not None
        return rec.uri

    def plan(plan_id: str, ckpt: str, at: str, attempt: int, pinned: tuple[str, ...]) -> Any:
        return ResumePlannedV2(
            job_id=JOB, plan_id=plan_id, failed_run_id="r", attempt=attempt, checkpoint_id=ckpt,
            checkpoint_uri=at, step=600, mode=ResumeMode.EXACT,
            compatibility=Compatibility.IDENTICAL, pinned=pinned,
        )  # fmt: skip

    gone = "job-1-c-gone"
    datas = [
        plan("p-old", gone, await uri(ids["fallback"]), 2, (gone, ids["fallback"])),
        ResumeVerifiedV1(job_id=JOB, plan_id="p-old", run_id="r", checkpoint_id=gone, step=600),
        plan("p-plan", ids["plan"], await uri(ids["plan"]), 5, ()),
        plan("p-res", ids["resume"], await uri(ids["resume"]), 4, ()),
        JobStartedV1(job_id=JOB, run_id="r", attempt=4, plan_id="p-res"),
    ]
    for n, data in enumerate(datas):
        now = datetime.now(UTC)
        await producer.publish(build(data, source="test/coordinator", time=now, key=f"ref{n}"))

    async def seen() -> bool:
        view = await jan.resumes.resumes(JOB)
        return (
            {"p-old", "p-plan", "p-res"} <= set(view.plans)
            and "p-old" in view.verdicts
            and 4 in view.starts
            and await jan.feed.caught_up()
        )

    await wait_for(seen, what="the janitor's view of the resumes")


async def test_every_protection_holds_dry_run_equals_real_run_and_tombstones_are_queryable(
    registrar: Registrar,
    producer: Bus,
    store: FsStore,
    janitor: tuple[Janitor, Clock],
    settings: ServiceSettings,
    tmp_path: Path,
) -> None:
    jan, clock = janitor
    steps = [50, 100, 200, 300, 400, 500, 600]
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    ids = {
        s: await write_valid(
            registrar, producer, store, s,
            traceparent=f"00-{trace_id}-00f067aa0ba902b7-01" if s == 50 else None,
        )
        for s in steps
    }  # fmt: skip
    # exploratory (no tier chosen or declared): keep the newest 2 valid; every checkpoint is
    # weeks old. Each of 100..400 is protected by exactly one reference; 50 by none.
    code, out, err = await cli(
        settings, tmp_path, "pin", ids[100], "--by", "eval:mmlu", "--reason", "baseline",
        "--actor", "alice",
    )  # fmt: skip
    assert code == 0, err
    assert "pinned by eval:mmlu" in out
    await coordinator_references(
        producer, registrar, jan, {"fallback": ids[200], "plan": ids[300], "resume": ids[400]}
    )

    code, out, err = await cli(settings, tmp_path, "retention", "plan", "--job", JOB, "--json")
    assert code == 0, err
    planned = {d["checkpoint_id"]: d for d in json.loads(out)}
    assert {c: planned[c]["action"] for c in ids.values()} == {
        ids[50]: "expire",
        ids[100]: "keep", ids[200]: "keep", ids[300]: "keep", ids[400]: "keep",
        ids[500]: "keep", ids[600]: "keep",
    }  # fmt: skip
    kinds = {c: [p["kind"] for p in planned[c]["protected_by"]] for c in ids.values()}
    assert kinds[ids[100]] == ["pin"]
    assert kinds[ids[200]] == ["fallback"]
    assert kinds[ids[300]] == ["restore_plan"]
    assert kinds[ids[400]] == ["resume"]
    assert kinds[ids[600]] == ["last_valid"]
    assert all(planned[c]["tier"] == "exploratory" for c in ids.values())
    assert "eval:mmlu" in planned[ids[100]]["reason"]

    code, out, err = await cli(settings, tmp_path, "retention", "plan", "--job", JOB)
    assert code == 0, err
    assert "PROTECTED BY" in out
    line = next(x for x in out.splitlines() if x.startswith(f"{JOB}  {ids[100]} "))
    assert "KEEP" in line
    assert "pin (eval:mmlu)" in line
    line = next(x for x in out.splitlines() if x.startswith(f"{JOB}  {ids[50]} "))
    assert "EXPIRE" in line

    # The real round does exactly what the dry run showed.
    result = await jan.run_once()
    assert result.expired == [ids[50]]
    # The tier is a (bounded) metric label.
    registry = jan.metrics.registry
    labels = {"service": "retention-janitor", "tier": "exploratory"}
    assert (
        registry.get_sample_value("ckpt_ha_retention_actions_total", {**labels, "action": "expire"})
        == 1
    )
    assert (
        registry.get_sample_value("ckpt_ha_retention_checkpoints", {**labels, "state": "valid"})
        == 7
    )
    assert (
        registry.get_sample_value(
            "ckpt_ha_retention_protected_checkpoints", {**labels, "kind": "pin"}
        )
        == 1
    )
    assert [(d.checkpoint_id, d.action.value) for d in result.decisions] == [
        (c, planned[c]["action"]) for c in planned
    ]
    expired = await state_of(registrar, ids[50], CheckpointState.EXPIRED)
    assert expired.expiry is not None
    assert expired.expiry.tier == "exploratory"
    assert expired.expiry.grace_until is not None

    # Within the grace period nothing is deleted; the bytes stay.
    again = await jan.run_once()
    assert again.deleted == []
    assert store.exists("job-1/step-000050/shard-0.bin")

    # After the grace period: the dry run says delete, and the round deletes exactly that.
    clock.offset = timedelta(hours=2)
    dry = {d.checkpoint_id: d.action.value for d in await jan.dry_run()}
    assert [c for c, a in dry.items() if a == "delete"] == [ids[50]]
    result = await jan.run_once()
    assert result.deleted == [ids[50]]
    assert result.expired == []
    gone = await state_of(registrar, ids[50], CheckpointState.DELETED)
    assert list(store.list("job-1/step-000050")) == []
    for s in steps[1:]:
        assert store.exists(f"job-1/step-{s:06d}/shard-0.bin")
        rec = await registrar.registry.get(ids[s])
        assert rec is not None
        assert rec.state is CheckpointState.VALID

    # The tombstone: id, URI, checksums, reason, policy, actor, time.
    assert gone.tombstone is not None
    code, out, err = await cli(settings, tmp_path, "audit", "--checkpoint", ids[50], "--json")
    assert code == 0, err
    [doc] = json.loads(out)["checkpoints"]
    assert doc["checkpoint_id"] == ids[50]
    assert doc["uri"] == store.uri("job-1/step-000050")
    assert doc["state"] == "deleted"
    assert doc["checksums"] == gone.checksums
    tomb = doc["tombstone"]
    assert tomb["actor"] == "retention-janitor"
    assert tomb["policy"].startswith("exploratory: keep_last=2")
    assert tomb["objects_deleted"] == 2
    assert "newest 2 valid" in tomb["reason"]
    assert [e["event_type"] for e in doc["events"]] == ["checkpoint.expired", "checkpoint.deleted"]
    # Expiry and deletion join the checkpoint's own trace, hours after it was written.
    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    retention = [
        json.loads(m.data)
        for m in msgs
        if ".checkpoint.expired." in m.subject or ".checkpoint.deleted." in m.subject
    ]
    mine = [e for e in retention if e["data"]["checkpoint_id"] == ids[50]]
    assert len(mine) == 2
    assert all(e["traceparent"].split("-")[1] == trace_id for e in mine)
    code, out, err = await cli(settings, tmp_path, "audit", "--job", JOB)
    assert code == 0, err
    assert f"tombstone {ids[50]}" in out
    assert "alice" in out  # the pin, with its actor
    code, out, err = await cli(settings, tmp_path, "checkpoints", "show", ids[50])
    assert code == 0, err
    assert "deleted by retention-janitor" in out
    assert "tier: exploratory (default" in out
    code, out, err = await cli(settings, tmp_path, "checkpoints", "show", ids[100])
    assert code == 0, err
    assert "pinned by eval:mmlu (alice" in out

    # Nothing keeps pointing at a deleted checkpoint: a pin on it (or on nothing) is refused.
    code, _, err = await cli(settings, tmp_path, "pin", ids[50], "--by", "eval:x", "--actor", "a")
    assert code == 4
    assert "was deleted" in err
    code, _, err = await cli(settings, tmp_path, "pin", "nope", "--by", "eval:x", "--actor", "a")
    assert code == 1
    assert "no checkpoint 'nope'" in err

    # Unpinning releases the checkpoint to the rules again (recorded with actor and reason).
    code, out, err = await cli(
        settings, tmp_path, "unpin", ids[100], "--by", "eval:mmlu", "--reason", "eval done",
        "--actor", "bob",
    )  # fmt: skip
    assert code == 0, err
    rec = await registrar.registry.get(ids[100])
    assert rec is not None
    assert rec.pins == ()
    assert (rec.history[-1].actor, rec.history[-1].event_type) == ("bob", "checkpoint.unpinned")
    result = await jan.run_once()
    assert result.expired == [ids[100]]
    await state_of(registrar, ids[100], CheckpointState.EXPIRED)

    # Pins, expiries and tombstones are part of the event stream: a rebuild reproduces them.
    before = await registrar.registry.dump()
    await registrar.registry.clear()
    await rebuild(
        registrar.registry, settings.bus(), CATALOG, partial(key_for_uri, registrar.store)
    )
    assert await registrar.registry.dump() == before


async def test_storage_outage_during_deletion_is_consistent_and_completes_later(
    registrar: Registrar,
    producer: Bus,
    store: FsStore,
    janitor: tuple[Janitor, Clock],
    tmp_path: Path,
) -> None:
    jan, clock = janitor
    ids = [await write_valid(registrar, producer, store, s) for s in (10, 20, 30, 40)]
    result = await jan.run_once()
    assert sorted(result.expired) == sorted(ids[:2])
    for c in ids[:2]:
        await state_of(registrar, c, CheckpointState.EXPIRED)
    clock.offset = timedelta(hours=2)

    # The volume goes away (a real failure of the real store: its root is missing).
    root = tmp_path / "storage"
    away = tmp_path / "storage-unmounted"
    os.rename(root, away)
    try:
        result = await jan.run_once()
    finally:
        os.rename(away, root)
    assert result.deleted == []
    assert set(result.failed) == set(ids[:2])
    assert "missing" in next(iter(result.failed.values()))
    for c in ids[:2]:
        rec = await registrar.registry.get(c)
        assert rec is not None
        assert rec.state is CheckpointState.EXPIRED  # not deleted while the bytes remain
        assert rec.tombstone is None
    assert store.exists("job-1/step-000010/shard-0.bin")

    # Storage is back: the next round completes the deletion, then records the tombstone.
    result = await jan.run_once()
    assert sorted(result.deleted) == sorted(ids[:2])
    for c in ids[:2]:
        rec = await state_of(registrar, c, CheckpointState.DELETED)
        assert rec.tombstone is not None
    assert list(store.list("job-1/step-000010")) == []
    assert store.exists("job-1/step-000040/shard-0.bin")


async def test_quarantined_and_partial_writes_are_cleaned_past_their_tier_retention(
    registrar: Registrar,
    producer: Bus,
    store: FsStore,
    janitor: tuple[Janitor, Clock],
    settings: ServiceSettings,
    tmp_path: Path,
) -> None:
    jan, _ = janitor
    keep = await write_valid(registrar, producer, store, 100)
    bad = await write_valid(registrar, producer, store, 50)
    code, _, err = await cli(
        settings, tmp_path, "quarantine", bad, "--reason", "loss spike", "--actor", "carol"
    )
    assert code == 0, err
    # Quarantined at the real time: within exploratory's 1 day quarantine retention.
    result = await jan.run_once()
    assert bad not in result.expired
    jan.clock = lambda: datetime.now(UTC) + timedelta(days=2)
    result = await jan.run_once()
    assert result.expired == [bad]
    await state_of(registrar, bad, CheckpointState.EXPIRED)
    rec = await registrar.registry.get(keep)
    assert rec is not None
    assert rec.state is CheckpointState.VALID


async def test_tier_default_declared_and_explicit_recorded_choice(
    registrar: Registrar,
    producer: Bus,
    store: FsStore,
    settings: ServiceSettings,
    tmp_path: Path,
) -> None:
    """The real janitor service: job.started records the declared tier; a registered checkpoint
    triggers a round; `tier set` records an explicit choice with actor and reason."""
    janitor_settings = RetentionJanitorSettings.model_validate(
        {**settings.model_dump(), "storage_root": str(tmp_path / "storage"),
         "retention_interval_s": 0}
    )  # fmt: skip
    svc = build_janitor_app(janitor_settings)
    await svc.bus.broker.start()
    try:
        ids = [await write_valid(registrar, producer, store, s) for s in (1, 2, 3)]
        # No tier anywhere: the cheapest; the registered consumer ran a round (keep_last=2).
        await state_of(registrar, ids[0], CheckpointState.EXPIRED)
        code, out, err = await cli(settings, tmp_path, "checkpoints", "list", "--job", JOB)
        assert code == 0, err
        assert "tier exploratory (default: no tier chosen or declared)" in out

        started = JobStartedV1(job_id=JOB, run_id="r2", policy=JobPolicy(tier="standard"))
        await producer.publish(build(started, source="test/runner", time=T0, key="s2"))

        async def declared() -> bool:
            return (await registrar.registry.tier_of(JOB)).tier.name == "standard"

        await wait_for(declared, what="declared tier recorded")

        code, out, err = await cli(
            settings, tmp_path, "tier", "set", "--job", JOB, "critical", "--reason",
            "release candidate", "--actor", "dana",
        )  # fmt: skip
        assert code == 0, err
        assert "standard (declared) -> critical by dana" in out
        code, out, err = await cli(settings, tmp_path, "tier", "show", "--job", JOB, "--json")
        assert code == 0, err
        shown = json.loads(out)
        assert (shown["tier"], shown["source"]) == ("critical", "chosen")
        assert [(e["tier"], e["actor"], e["reason"]) for e in shown["log"]] == [
            ("critical", "dana", "release candidate")
        ]
        # A later job.started declaring a cheaper tier does not override the recorded choice.
        started = JobStartedV1(job_id=JOB, run_id="r3", tier="exploratory")
        await producer.publish(build(started, source="test/runner", time=T0, key="s3"))

        async def redeclared() -> bool:
            return await registrar.registry.declared_tier(JOB) == "exploratory"

        await wait_for(redeclared, what="the later declaration recorded")
        args = ("checkpoints", "list", "--job", JOB, "--json")
        code, out, err = await cli(settings, tmp_path, *args)
        assert code == 0, err
        assert {d["tier"] for d in json.loads(out)} == {"critical"}
        # The tier is on the registered event of the next checkpoint too.
        newer = await write_valid(registrar, producer, store, 4)

        async def registered_tier() -> str | None:
            msgs = await stream_messages(settings.nats_url, settings.events_stream)
            for m in msgs:
                doc = json.loads(m.data)
                registered = doc["type"] == "ckpt-ha.checkpoint.registered.v1"
                if registered and doc["data"]["checkpoint_id"] == newer:
                    return str(doc["data"]["tier"])
            return None

        assert await wait_for(registered_tier, what="registered event") == "critical"

        code, _, err = await cli(
            settings, tmp_path, "tier", "set", "--job", JOB, "platinum", "--reason", "x",
            "--actor", "d",
        )  # fmt: skip
        assert code == 4
        assert "unknown tier 'platinum'" in err
        code, _, err = await cli(
            settings, tmp_path, "tier", "set", "--job", "no-such-job", "critical", "--reason",
            "x", "--actor", "d",
        )  # fmt: skip
        assert code == 4
        assert "no job 'no-such-job'" in err
    finally:
        await svc.bus.broker.stop()
        await svc.registry.close()


async def test_reconcile_reports_unknown_objects_and_deletes_only_when_told(
    registrar: Registrar,
    producer: Bus,
    store: FsStore,
    settings: ServiceSettings,
    tmp_path: Path,
) -> None:
    known = await write_valid(registrar, producer, store, 7)
    store.put("job-1/step-000999/shard-0.bin", b"orphan")
    store.put("stray.bin", b"?")
    env = env_for(store)

    code, out, err = await cli(settings, tmp_path, "reconcile", "--json", env=env)
    assert code == 1, err
    doc = json.loads(out)
    assert sorted(o["key"] for o in doc["unknown"]) == [
        "job-1/step-000999/shard-0.bin",
        "stray.bin",
    ]
    assert doc["deleted"] == 0
    assert store.exists("stray.bin")

    code, _, err = await cli(settings, tmp_path, "reconcile", "--delete", env=env)
    assert code == 2
    assert "--delete needs --reason" in err

    # Fresh objects may be a write in progress: reported, never deleted.
    code, out, err = await cli(
        settings, tmp_path, "reconcile", "--delete", "--reason", "orphans", "--actor", "eve",
        "--yes", env=env,
    )  # fmt: skip
    assert code == 1
    assert "too young" in out
    assert store.exists("stray.bin")

    code, out, err = await cli(
        settings, tmp_path, "reconcile", "--delete", "--min-age", "0", "--reason", "orphans",
        "--actor", "eve", "--json", "--yes", env=env,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["deleted"] == 2
    assert not store.exists("stray.bin")
    assert store.exists("job-1/step-000007/shard-0.bin")
    rec = await registrar.registry.get(known)
    assert rec is not None
    assert rec.state is CheckpointState.VALID
    code, out, err = await cli(settings, tmp_path, "audit", "--json")
    assert code == 0, err
    cleaned = json.loads(out)["unregistered_objects_deleted"]
    assert sorted(c["key"] for c in cleaned) == ["job-1/step-000999/shard-0.bin", "stray.bin"]
    assert {(c["actor"], c["reason"]) for c in cleaned} == {("eve", "orphans")}
    # Not in the event stream, so a registry rebuild keeps it.
    await registrar.registry.clear()
    assert len(await registrar.registry.reconcile_log()) == 2


async def test_reconcile_reports_leftovers_on_a_replica_root_too(
    registrar: Registrar,
    producer: Bus,
    store: FsStore,
    settings: ServiceSettings,
    tmp_path: Path,
) -> None:
    """Issue 29: under a replica root (``CKPT_HA_REPLICA_ROOTS``) a live copy of a live
    checkpoint is known; a folder no record names as its copy, and a copy recorded deleted
    whose bytes stayed, are leftovers, reported and deleted like the primary's."""
    replica = FsStore(tmp_path / "replica")
    (tmp_path / "replica").mkdir()
    kept = await write_valid(registrar, producer, store, 7)
    dropped = await write_valid(registrar, producer, store, 8)
    for step, ckpt, state in ((7, kept, CopyState.VALID), (8, dropped, CopyState.DELETED)):
        prefix = f"{JOB}/step-{step:06d}"
        replica.put(f"{prefix}/shard-0.bin", b"x" * 100)
        rec = await registrar.registry.get(ckpt)
        assert rec is not None
        change = CheckpointCopyChangedV1(
            job_id=JOB, checkpoint_id=ckpt, uri=rec.uri, copy_uri=replica.uri(prefix),
            copy_state=state, tier="critical",
        )  # fmt: skip
        await producer.publish(build(change, source="test/checker", time=T0, key=f"copy-{step}"))

        async def recorded(ckpt: str = ckpt, uri: str = replica.uri(prefix)) -> bool:
            rec = await registrar.registry.get(ckpt)
            return rec is not None and uri in rec.copies

        await wait_for(recorded, what=f"the copy of {ckpt} recorded")
    replica.put(f"{JOB}/step-000999/shard-0.bin", b"orphan")
    replica_root = str(tmp_path / "replica")
    env = {**env_for(store), "CKPT_HA_REPLICA_ROOTS": json.dumps({"critical": replica_root})}

    code, out, err = await cli(settings, tmp_path, "reconcile", "--json", env=env)
    assert code == 1, err
    doc = json.loads(out)
    assert sorted((o["key"], o.get("replica")) for o in doc["unknown"]) == [
        (f"{JOB}/step-000008/shard-0.bin", replica_root),
        (f"{JOB}/step-000999/shard-0.bin", replica_root),
    ]
    code, out, err = await cli(
        settings, tmp_path, "reconcile", "--delete", "--min-age", "0", "--reason", "copies",
        "--actor", "eve", "--yes", env=env,
    )  # fmt: skip
    assert code == 0, err
    assert "deleted 2 object(s)" in out
    assert replica.exists(f"{JOB}/step-000007/shard-0.bin")  # a live copy: kept
    assert not replica.exists(f"{JOB}/step-000008/shard-0.bin")
    assert store.exists(f"{JOB}/step-000008/shard-0.bin")  # the primary's same key: untouched
    log = await registrar.registry.reconcile_log()
    assert sorted(e["uri"] for e in log) == sorted(
        replica.uri(f"{JOB}/step-{s}/shard-0.bin") for s in ("000008", "000999")
    )
    assert {e["replica"] for e in log} == {replica_root}


async def test_index_stays_readable_after_deletion_and_owner_change_without_widening_access(
    registrar: Registrar,
    producer: Bus,
    store: FsStore,
    janitor: tuple[Janitor, Clock],
    settings: ServiceSettings,
    tmp_path: Path,
) -> None:
    """R5: the job's checkpoints are cleaned and its owner leaves; the index (tombstones
    included) stays readable for the owning project, and a transfer moves, never shares."""
    jan, clock = janitor
    ids = [await write_valid(registrar, producer, store, s, project="vision") for s in (1, 2, 3)]
    await jan.run_once()
    await state_of(registrar, ids[0], CheckpointState.EXPIRED)
    clock.offset = timedelta(hours=2)
    await jan.run_once()
    await state_of(registrar, ids[0], CheckpointState.DELETED)

    code, _, err = await cli(
        settings, tmp_path, "owner", "transfer", "--from", "vision", "--to", "nlp",
        "--reason", "vision team disbanded", "--actor", "frank",
    )  # fmt: skip
    assert code == 0, err

    code, out, err = await cli(settings, tmp_path, "owner", "show", "--project", "nlp", "--json")
    assert code == 0, err
    [row] = json.loads(out)["jobs"]
    assert row["job"] == JOB
    assert row["checkpoints"] == {"deleted": 1, "valid": 2}
    assert row["latest_valid"] == ids[2]
    # Moved, not shared: the old project no longer lists it.
    code, out, err = await cli(settings, tmp_path, "owner", "show", "--project", "vision")
    assert code == 0, err
    assert "owns no jobs" in out
    code, out, err = await cli(settings, tmp_path, "checkpoints", "list", "--job", JOB)
    assert code == 0, err
    assert "owned by nlp" in out
    assert ids[0] in out
    assert "deleted" in out
    code, out, err = await cli(settings, tmp_path, "audit", "--job", JOB, "--json")
    assert code == 0, err
    [tomb] = [c for c in json.loads(out)["checkpoints"] if c["tombstone"]]
    assert tomb["checkpoint_id"] == ids[0]


def _plan(plan_id: str, ckpt: str, uri: str, step: int, pinned: tuple[str, ...]) -> Any:
    return ResumePlannedV2(
        job_id=JOB, plan_id=plan_id, failed_run_id="r", attempt=2, checkpoint_id=ckpt,
        checkpoint_uri=uri, step=step, mode=ResumeMode.EXACT,
        compatibility=Compatibility.IDENTICAL, pinned=pinned,
    )  # fmt: skip


async def test_a_plan_published_just_before_a_round_is_always_honoured(
    registrar: Registrar, producer: Bus, store: FsStore, janitor: tuple[Janitor, Clock]
) -> None:
    """The window between the coordinator's decision and the janitor applying it: a round that
    starts after ``resume.planned`` was published either waits (`ResumesBehind`) or sees the
    plan; it never expires what the plan names."""
    jan, _ = janitor
    ids = {s: await write_valid(registrar, producer, store, s) for s in (100, 200, 300, 400)}
    rec = await registrar.registry.get(ids[100])
    assert rec is not None
    plan = _plan("p-race", ids[100], rec.uri, 100, (ids[100], ids[200]))
    await producer.publish(
        build(plan, source="test/coordinator", time=datetime.now(UTC), key="race")
    )

    async def round_done() -> RoundResult | None:
        try:
            return await jan.run_once()
        except ResumesBehind:
            return None  # the view applies the plan meanwhile

    result = await wait_for(round_done, what="a round after the view caught up")
    assert isinstance(result, RoundResult)
    assert result.expired == []  # 100 and 200: the plan and its pins; 300, 400: keep_last
    kinds = {d.checkpoint_id: [p.kind.value for p in d.protected_by] for d in result.decisions}
    assert kinds[ids[100]] == ["fallback", "restore_plan"]
    assert kinds[ids[200]] == ["fallback"]


async def test_the_janitor_service_releases_pins_once_the_resumed_job_registers_a_newer_one(
    registrar: Registrar, producer: Bus, store: FsStore, settings: ServiceSettings
) -> None:
    """The real service: its consumers keep the view (``resume.planned`` pins the restored and
    the fallback checkpoint), a registration past the restored step releases them, and the
    round that registration triggers expires the fallback the tier no longer keeps."""
    svc = build_janitor_app(
        RetentionJanitorSettings.model_validate(
            {**settings.model_dump(), "retention_interval_s": 0}
        )
    )
    await svc.bus.broker.start()
    try:
        ids = {s: await write_valid(registrar, producer, store, s) for s in (100, 200)}
        rec = await registrar.registry.get(ids[200])
        assert rec is not None
        plan = _plan("p-rel", ids[200], rec.uri, 200, (ids[200], ids[100]))
        await producer.publish(
            build(plan, source="test/coordinator", time=datetime.now(UTC), key="rel")
        )

        async def pinned() -> bool:
            view = await svc.janitor.resumes.resumes(JOB)
            return len(view.pins) == 2

        await wait_for(pinned, what="the plan's pins in the janitor's view")
        ids[150] = await write_valid(registrar, producer, store, 150)  # not past the restored step
        await wait_for(lambda: svc.janitor.feed.caught_up(), what="the janitor caught up")
        decisions = {d.checkpoint_id: d for d in await svc.janitor.dry_run([JOB])}
        assert decisions[ids[100]].action is Action.KEEP
        assert [p.kind for p in decisions[ids[100]].protected_by] == [ProtectionKind.FALLBACK]

        # The resumed attempt's own, past the restored step: releases both pins.
        ids[300] = await write_valid(registrar, producer, store, 300, attempt=2)
        await state_of(registrar, ids[100], CheckpointState.EXPIRED)
        assert (await svc.janitor.resumes.resumes(JOB)).pins == {}
        assert (await registrar.registry.get(ids[200])) is not None
    finally:
        await svc.bus.broker.stop()
        await svc.registry.close()
