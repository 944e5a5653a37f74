"""The operations layer (`ckpt_ha.ops`) against a real Redis registry (unique prefix), a real
filesystem store and, for the stream-reading ones, a real nats-server. The registrar's part is
played by `ProjectingPublisher` (the real `Registry.apply` on every published event), or left
out to prove an operation never reports what was not recorded."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.formats import native
from ckpt_ha.ops import actions, audit, checkpoints, dead_letters, owners, reconcile, tiers
from ckpt_ha.ops.actions import ActionRefused
from ckpt_ha.ops.errors import (
    CheckpointNotFound,
    ListingFailed,
    NothingToAudit,
    NotRecorded,
    RegistryNotEmpty,
)
from ckpt_ha.ops.rebuild import rebuild_registry
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore
from tests.support.events import T0, committed, verified
from tests.support.fakes.projecting_publisher import ProjectingPublisher
from tests.support.fakes.publisher import RecordingPublisher

pytestmark = pytest.mark.integration

NOW = T0 + timedelta(hours=1)


@pytest.fixture
async def registry(settings: ServiceSettings) -> AsyncIterator[Registry]:
    reg = Registry.from_url(settings.redis_url, settings.registry_prefix)
    yield reg
    await reg.close()


async def valid(
    registry: Registry,
    ckpt: str,
    job: str = "job-1",
    *,
    project: str | None = None,
    step: int = 100,
    uri: str | None = None,
) -> None:
    """A checkpoint committed and verified, as the registrar records it."""
    event = committed(ckpt, job=job, step=step, uri=uri, key=ckpt, project=project)
    await registry.apply(event)
    await registry.apply(verified(ckpt, job=job, step=step, key=ckpt))


async def test_manual_actions_return_what_the_registry_recorded(registry: Registry) -> None:
    await valid(registry, "c1", project="vision")
    pub = ProjectingPublisher(registry)

    rec = await checkpoints.quarantine(
        registry, pub, "c1", reason="loss spiked", actor="alice", now=NOW
    )
    assert rec.state is CheckpointState.QUARANTINED
    assert (rec.history[-1].actor, rec.history[-1].reason) == ("alice", "loss spiked")
    assert rec.history[-1].event_id == pub.events[-1].id
    with pytest.raises(ActionRefused, match="already quarantined"):
        await checkpoints.quarantine(registry, pub, "c1", reason="again", actor="a", now=NOW)
    assert len(pub.events) == 1, "a refused action publishes nothing"

    rec = await checkpoints.release(registry, pub, "c1", reason="fine", actor="bob", now=NOW)
    assert rec.state is CheckpointState.PENDING_VERIFICATION
    await registry.apply(verified("c1", key="again"))

    rec = await checkpoints.pin(registry, pub, "c1", by="eval:x", reason="r", actor="a", now=NOW)
    assert [p.by for p in rec.pins] == ["eval:x"]
    rec = await checkpoints.unpin(registry, pub, "c1", by="eval:x", reason="r", actor="a", now=NOW)
    assert rec.pins == ()

    with pytest.raises(CheckpointNotFound, match="no checkpoint 'nope' in the registry"):
        await checkpoints.quarantine(registry, pub, "nope", reason="r", actor="a", now=NOW)


async def test_an_action_nobody_records_is_reported_not_assumed(registry: Registry) -> None:
    await valid(registry, "c1")
    unheard = RecordingPublisher()  # published, but no registrar consumes it
    with pytest.raises(NotRecorded, match=r"within 0.2 s .*is it running.*; event "):
        await checkpoints.act(
            registry,
            unheard,
            "c1",
            lambda r: actions.quarantine(r, "x", "a"),
            now=NOW,
            timeout_s=0.2,
        )
    assert len(unheard.events) == 1
    assert (await checkpoints.show(registry, "c1")).record.state is CheckpointState.VALID


async def test_reads_of_a_job_and_a_checkpoint(registry: Registry) -> None:
    await valid(registry, "c1", project="vision", step=100)
    await valid(registry, "c2", project="vision", step=200)
    found = await checkpoints.of_job(registry, "job-1")
    assert [r.checkpoint_id for r in found.records] == ["c2", "c1"]
    assert (found.owner, found.tier.source) == ("vision", "default")
    assert (await checkpoints.of_job(registry, "job-1", CheckpointState.CORRUPT)).records == []
    view = await checkpoints.show(registry, "c1")
    assert view.record.checkpoint_id == "c1"
    assert view.tier == found.tier


async def test_owner_transfer_moves_each_job_and_refuses_a_wrong_owner(
    registry: Registry,
) -> None:
    await valid(registry, "a1", job="job-a", project="vision")
    await valid(registry, "b1", job="job-b", project="vision")
    pub = ProjectingPublisher(registry)

    with pytest.raises(ActionRefused, match=r"not owned by nlp: job-a \(vision\)"):
        await owners.transfer(
            registry, pub, from_project="nlp", to_project="x", jobs=["job-a"],
            reason="r", actor="a", now=NOW,
        )  # fmt: skip
    moved = await owners.transfer(
        registry, pub, from_project="vision", to_project="nlp", jobs=None,
        reason="reorg", actor="carol", now=NOW,
    )  # fmt: skip
    assert moved == {"job-a": "nlp", "job-b": "nlp"}
    owner = await owners.of_job(registry, "job-a")
    assert owner.owner == "nlp"
    assert [(e.from_project, e.to_project, e.actor) for e in owner.log] == [
        (None, "vision", owner.log[0].actor),
        ("vision", "nlp", "carol"),
    ]
    project = await owners.of_project(registry, "nlp")
    assert [(j.job_id, j.latest_valid) for j in project] == [("job-a", "a1"), ("job-b", "b1")]
    assert await owners.of_project(registry, "vision") == []
    with pytest.raises(ActionRefused, match="no jobs owned by <no project>"):
        await owners.transfer(
            registry, pub, from_project=None, to_project="x", jobs=None,
            reason="r", actor="a", now=NOW,
        )  # fmt: skip


async def test_a_tier_choice_is_recorded_and_shown(registry: Registry) -> None:
    await valid(registry, "c1")
    pub = ProjectingPublisher(registry)
    with pytest.raises(ActionRefused, match="unknown tier 'gold'"):
        await tiers.choose(registry, pub, "job-1", "gold", reason="r", actor="a", now=NOW)
    with pytest.raises(ActionRefused, match="no job 'ghost'"):
        await tiers.choose(registry, pub, "ghost", "critical", reason="r", actor="a", now=NOW)
    change = await tiers.choose(
        registry, pub, "job-1", "critical", reason="deadline", actor="dana", now=NOW
    )
    assert change.before.source == "default"
    assert (change.chosen.tier, change.chosen.actor) == ("critical", "dana")
    shown = await tiers.of_job(registry, "job-1")
    assert (shown.choice.tier.name, shown.choice.source) == ("critical", "chosen")
    assert [e.reason for e in shown.log] == ["deadline"]
    costs = [t["cost"] for t in tiers.table()]
    assert costs == sorted(costs)


async def test_audit_shows_pins_and_refuses_an_unaudited_checkpoint(registry: Registry) -> None:
    await valid(registry, "c1")
    await valid(registry, "c2", step=200)
    with pytest.raises(NothingToAudit, match="nothing to audit for checkpoint 'c1'"):
        await audit.audit(registry, checkpoint_id="c1")
    pub = ProjectingPublisher(registry)
    await checkpoints.pin(registry, pub, "c1", by="eval:x", reason="r", actor="a", now=NOW)
    one = await audit.audit(registry, checkpoint_id="c1")
    assert [r.checkpoint_id for r in one.records] == ["c1"]
    assert [h.event_type for h in audit.events(one.records[0])] == ["checkpoint.pinned"]
    job = await audit.audit(registry, job_id="job-1")
    assert [r.checkpoint_id for r in job.records] == ["c1"]
    assert (await audit.audit(registry)).records == [], "nothing deleted or expired"


async def test_reconcile_reports_unknown_objects_and_deletes_only_old_ones_when_told(
    registry: Registry, tmp_path: Path
) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    store = FsStore(volume)
    native.write(store, "job-1/step-100", {"w.bin": b"x"}, step=100, created_at=T0)
    await valid(registry, "c1", uri=store.uri("job-1/step-100"))
    store.put("stray/old.bin", b"old")
    store.put("stray/new.bin", b"new")
    old = (datetime.now(UTC) - timedelta(hours=2)).timestamp()
    os.utime(volume / "stray" / "old.bin", (old, old))

    def clock() -> datetime:
        return datetime.now(UTC)

    found = await reconcile.reconcile(registry, store, clock=clock, min_age_s=3600)
    assert {(o.key, o.old_enough) for o in found.unknown} == {
        ("stray/old.bin", True),
        ("stray/new.bin", False),
    }
    assert (found.deleted, found.clean) == (0, False)
    assert store.exists("stray/old.bin")

    order = reconcile.Deletion(actor="erin", reason="leftovers")
    done = await reconcile.reconcile(registry, store, clock=clock, min_age_s=3600, delete=order)
    assert done.deleted == 1
    assert not store.exists("stray/old.bin")
    assert store.exists("stray/new.bin")
    assert store.exists("job-1/step-100/w.bin"), "registered bytes are never touched"
    [logged] = await registry.reconcile_log()
    assert (logged["key"], logged["actor"], logged["reason"]) == (
        "stray/old.bin",
        "erin",
        "leftovers",
    )
    assert (await audit.audit(registry)).cleaned == [logged]

    volume.rename(tmp_path / "unmounted")  # the volume is gone: never read as "all absent"
    with pytest.raises(ListingFailed, match="nothing done"):
        await reconcile.reconcile(registry, store, clock=clock, min_age_s=0, delete=order)
    assert len(await registry.reconcile_log()) == 1


async def test_rebuild_refuses_a_full_registry_unless_cleared(
    registry: Registry, settings: ServiceSettings, producer: Bus
) -> None:
    await producer.publish(committed("c1", key="c1"))
    await producer.publish(verified("c1", key="c1"))
    await valid(registry, "c1")
    before = await registry.get("c1")
    with pytest.raises(RegistryNotEmpty, match="pass --clear"):
        await rebuild_registry(registry, settings.bus(), clear=False)
    report = await rebuild_registry(registry, settings.bus(), clear=True)
    assert (report.read, report.applied, report.duplicates) == (2, 2, 0)
    after = await registry.get("c1")
    assert after is not None
    assert before is not None
    assert after.state is before.state is CheckpointState.VALID


async def test_dead_letters_are_read_from_the_stream_headers(settings: ServiceSettings) -> None:
    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        assert await dead_letters.newest(js, settings.dead_letter_stream, 10) == []
        for i in range(3):
            headers = {
                "Ckpt-Consumer": "registrar--checkpoints",
                "Ckpt-Error-Code": "malformed",
                "Ckpt-Delivery-Count": "1",
                "Ckpt-Original-Subject": f"s.{i}",
                "Ckpt-Error": f"bad {i}",
            }
            await js.publish(f"{settings.subject_prefix}.dlq.x", b"x" * i, headers=headers)
        letters = await dead_letters.newest(js, settings.dead_letter_stream, 2)
    finally:
        await nc.close()
    assert [(d.seq, d.subject, d.error, d.bytes) for d in letters] == [
        (2, "s.1", "bad 1", 1),
        (3, "s.2", "bad 2", 2),
    ]
    assert letters[0].to_json()["consumer"] == "registrar--checkpoints"
