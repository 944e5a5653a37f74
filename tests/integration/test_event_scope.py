"""Every event is scoped: its body agrees with its subject, and a job speaks only for itself.

Crafted inputs against the real registrar, NATS and Redis; each would have changed another job's
checkpoints before events were scoped. Every one is dead-lettered with its code and reason, and
nothing else is affected: the good events around it are all applied.
"""

from __future__ import annotations

from functools import partial

import nats
import pytest

from ckpt_ha.bus import streams
from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.permissions import PRINCIPALS
from ckpt_ha.contracts import framing, signing
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.contracts.subjects import event_subject
from ckpt_ha.core.locations import KeyOf
from ckpt_ha.ops.errors import StreamIncomplete
from ckpt_ha.ops.rebuild import rebuild_registry
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import key_for_uri, open_store
from tests.support.bus_tools import job_key, publish_raw, stream_messages, wait_for
from tests.support.events import committed, expired, verified

pytestmark = pytest.mark.integration


def key_of(settings: ServiceSettings) -> KeyOf:
    return partial(key_for_uri, open_store(settings.storage_root))


def subject(settings: ServiceSettings, event_type: str, job: str, version: int = 1) -> str:
    return event_subject(settings.subject_prefix, event_type, version, job)


def signed_by(job: str, subj: str, body: bytes) -> dict[str, str]:
    return {framing.SIGNATURE: framing.signature(job_key(job), subj, body)}


async def dead_letter_codes(settings: ServiceSettings, n: int) -> list[str]:
    async def probe() -> list[str]:
        msgs = await stream_messages(settings.nats_url, settings.dead_letter_stream)
        codes = [(m.headers or {}).get("Ckpt-Error-Code", "") for m in msgs]
        return codes if len(codes) >= n else []

    return await wait_for(probe, timeout=15, what=f"{n} dead letters")


async def state_of(reg: Registrar, ckpt: str) -> CheckpointState | None:
    rec = await reg.registry.get(ckpt)
    return rec.state if rec is not None else None


async def test_forged_and_mismatched_events_are_refused_alone(
    registrar: Registrar, settings: ServiceSettings
) -> None:
    victim, evil = "job-victim", "job-evil"
    # The victim's checkpoint becomes valid through properly scoped, signed events.
    for event in (committed("v1", job=victim), verified("v1", job=victim)):
        subj = subject(settings, event.event_type, victim)
        await publish_raw(settings.nats_url, subj, event.to_bytes())
    await wait_for(lambda: _is(registrar, "v1", CheckpointState.VALID), what="victim valid")

    crafted: list[tuple[str, bytes, dict[str, str] | None, str]] = []
    # 1. An `expired` body on a `committed` subject, signed by the subject's job.
    body = expired("v1", job=victim).to_bytes()
    subj = subject(settings, "checkpoint.committed", victim)
    crafted.append((subj, body, signed_by(victim, subj, body), "subject_mismatch"))
    # 2. The victim's `expired` on the evil job's subject (evil signs it with its own key).
    subj = subject(settings, "checkpoint.expired", evil)
    crafted.append((subj, body, signed_by(evil, subj, body), "subject_mismatch"))
    # 3. A `committed` for the victim, unsigned.
    forged = committed("v2", job=victim, step=200).to_bytes()
    subj = subject(settings, "checkpoint.committed", victim)
    crafted.append((subj, forged, None, "unsigned"))
    # 4. The same, signed with the evil job's key (the credentials a job really holds).
    crafted.append((subj, forged, signed_by(evil, subj, forged), "forged"))
    # 5. A v1 subject carrying a body that says another version.
    subj = subject(settings, "checkpoint.committed", victim, version=2)
    crafted.append((subj, forged, signed_by(victim, subj, forged), "subject_mismatch"))

    good = [committed(f"g{i}", job=evil, step=i) for i in range(5)]
    for i, (subj, data, headers, _) in enumerate(crafted):
        await publish_raw(settings.nats_url, subj, data, headers, sign=False)
        event = good[i % len(good)]
        await publish_raw(
            settings.nats_url, subject(settings, event.event_type, evil), event.to_bytes()
        )

    codes = await dead_letter_codes(settings, len(crafted))
    assert sorted(codes) == sorted(code for *_, code in crafted)
    for event in good:  # collateral damage: none
        await wait_for(
            lambda e=event: _is(
                registrar, e.data.subject_key(), CheckpointState.PENDING_VERIFICATION
            ),
            what=f"good event {event.data.subject_key()} applied",
        )
    assert await state_of(registrar, "v1") is CheckpointState.VALID
    assert await state_of(registrar, "v2") is None


async def _state(registry: Registry, ckpt: str) -> CheckpointState | None:
    rec = await registry.get(ckpt)
    return rec.state if rec is not None else None


async def _is(reg: Registrar, ckpt: str, want: CheckpointState) -> bool:
    return await state_of(reg, ckpt) is want


async def test_a_rebuild_refuses_what_the_live_consumer_refused(
    registrar: Registrar, settings: ServiceSettings
) -> None:
    good = committed("r1", job="job-a")
    await publish_raw(
        settings.nats_url, subject(settings, good.event_type, "job-a"), good.to_bytes()
    )
    forged = committed("r2", job="job-b").to_bytes()
    subj = subject(settings, "checkpoint.committed", "job-b")
    await publish_raw(settings.nats_url, subj, forged, signed_by("job-a", subj, forged), sign=False)
    await dead_letter_codes(settings, 1)
    await wait_for(lambda: _is(registrar, "r1", CheckpointState.PENDING_VERIFICATION), what="r1")
    live = [await state_of(registrar, c) for c in ("r1", "r2")]
    assert live == [CheckpointState.PENDING_VERIFICATION, None]

    fresh = Registry.from_url(settings.redis_url, f"{settings.registry_prefix}:rebuilt")
    try:
        report = await rebuild_registry(fresh, settings.bus(), key_of(settings), clear=False)
        assert report.skipped == {"forged": 1}
        assert [await _state(fresh, c) for c in ("r1", "r2")] == live
    finally:
        await fresh.clear()
        await fresh.close()


async def test_a_rebuild_fails_loudly_on_a_stream_that_lost_its_first_events(
    settings: ServiceSettings,
) -> None:
    """A stream provisioned without deny_purge (an older release's) that was purged: the
    rebuild refuses before it clears anything."""
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    try:
        await js.delete_stream(settings.events_stream)
        want = streams.desired(settings.bus())[0]
        want.deny_purge = False
        await js.add_stream(want)
        event = committed("p1")
        await publish_raw(
            settings.nats_url, subject(settings, event.event_type, "job-1"), event.to_bytes()
        )
        await js.purge_stream(settings.events_stream)
        await publish_raw(
            settings.nats_url,
            subject(settings, event.event_type, "job-1"),
            committed("p2").to_bytes(),
        )
    finally:
        await nc.close()
    registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
    try:
        await registry.apply(committed("kept"))
        with pytest.raises(StreamIncomplete, match="starts at sequence 2, not 1"):
            await rebuild_registry(registry, settings.bus(), key_of(settings), clear=True)
        assert await _state(registry, "kept") is CheckpointState.PENDING_VERIFICATION  # not cleared
    finally:
        await registry.close()


def test_signed_types_are_exactly_what_jobs_and_their_runners_may_publish() -> None:
    job_side = {t for p in PRINCIPALS if p.user in ("job", "runner") for t in p.publishes}
    assert job_side == signing.SIGNED_TYPES
    for p in PRINCIPALS:
        if p.user == "job":
            assert p.watches == ()
            assert p.consumers == ()


async def test_nobody_without_the_jobs_key_can_pre_empt_its_announcement(
    registrar: Registrar, producer: Bus, settings: ServiceSettings
) -> None:
    """JetStream drops a message whose id it has seen: a forger who publishes first under the
    id a job's announcement will carry must not suppress it."""
    event = committed("pre1", job="job-p")
    subj = subject(settings, event.event_type, "job-p")
    await publish_raw(settings.nats_url, subj, b"garbage", {"Nats-Msg-Id": event.id}, sign=False)
    await producer.publish(event)  # signed by a holder of the master key, as the watcher does
    await wait_for(
        lambda: _is(registrar, "pre1", CheckpointState.PENDING_VERIFICATION),
        what="the real announcement applied",
    )
    assert await dead_letter_codes(settings, 1) == ["unsigned"]
