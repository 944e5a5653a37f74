"""``ckpt-ha dead-letters replay`` against the real nats-server and Redis: after a fix, dead
letters are re-published with their original bytes and signature, each once however often the
replay runs, and refusals of who may say what are never re-published."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointState
from ckpt_ha.contracts.subjects import event_filter
from ckpt_ha.core.errors import TransientError
from ckpt_ha.core.locations import JobMismatch
from ckpt_ha.ops import dead_letters
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.cli_tools import cli
from tests.support.events import committed, verified

pytestmark = pytest.mark.integration


async def letters_of(settings: ServiceSettings, n: int) -> list[dead_letters.DeadLetter]:
    async def probe() -> list[dead_letters.DeadLetter]:
        nc = await nats.connect(settings.nats_url)
        try:
            found = await dead_letters.newest(nc.jetstream(), settings.dead_letter_stream, 50)
        finally:
            await nc.close()
        return found if len(found) >= n else []

    return await wait_for(probe, timeout=20, what=f"{n} dead letters")


async def count_events(settings: ServiceSettings, needle: bytes) -> int:
    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    return sum(needle in m.data for m in msgs)


async def test_replay_after_a_fix_publishes_each_dead_letter_once(
    registrar: Registrar, producer: Bus, settings: ServiceSettings, tmp_path: Path
) -> None:
    """A `verified` that waited longer than the retry budget for its `committed` was
    dead-lettered; once the commit is there, a replay makes the checkpoint valid. A second
    replay publishes nothing."""
    await producer.publish(verified("late"))
    [letter] = await letters_of(settings, 1)
    assert (letter.code, letter.consumer) == ("max_deliver", "registrar--checkpoints")
    await producer.publish(committed("late"))

    async def state(want: CheckpointState) -> bool:
        rec = await registrar.registry.get("late")
        return rec is not None and rec.state is want

    await wait_for(lambda: state(CheckpointState.PENDING_VERIFICATION), what="pending")

    code, out, err = await cli(
        settings, tmp_path, "dead-letters", "replay", "--reason", "max_deliver", "--dry-run"
    )
    assert (code, err) == (0, "")
    assert "would replay 1 dead letter(s)" in out
    assert await count_events(settings, b'"checkpoint_id":"late"') == 2  # nothing published

    code, out, err = await cli(
        settings,
        tmp_path,
        "dead-letters",
        "replay",
        "--reason",
        "max_deliver",
        "--actor",
        "ops-1",
        "--yes",
    )
    assert (code, err) == (0, "")
    assert "replayed 1 dead letter(s)" in out
    await wait_for(lambda: state(CheckpointState.VALID), what="valid after the replay")

    code, out, _ = await cli(settings, tmp_path, "dead-letters", "replay", "--json")
    assert code == 0
    again = json.loads(out)
    assert again["replayed"] == []
    [done] = again["already_replayed"]
    assert done["seq"] == letter.seq
    assert done["replayed_as"] is not None
    verified_events = await count_events(settings, b"checkpoint.verified")
    assert verified_events == 2  # the original and one replay, never two

    code, out, _ = await cli(settings, tmp_path, "dead-letters", "--json")
    [listed] = json.loads(out)  # the replay marker is not listed as a dead letter
    assert (listed["seq"], listed["replayed_as"]) == (letter.seq, done["replayed_as"])
    rec = await registrar.registry.get("late")
    assert rec is not None
    assert [h.state for h in rec.history] == [
        CheckpointState.PENDING_VERIFICATION,
        CheckpointState.VALID,
    ]


async def test_a_signed_event_is_replayed_with_its_signature_and_security_refusals_are_not(
    settings: ServiceSettings, producer: Bus
) -> None:
    """A job's `committed` refused while a dependency was down comes back signed (admission
    accepts it); a `job_mismatch` refusal is selected but never re-published."""
    fixed = False
    seen: list[str] = []
    bus = Bus(settings.bus(), "replay-test")

    @bus.consumer("commits", event_filter(settings.subject_prefix, "checkpoint.committed"))
    async def on_commit(event: Envelope[EventData]) -> None:
        assert isinstance(event.data, CheckpointCommittedV1)
        if event.data.checkpoint_id == "not-yours":
            raise JobMismatch("job-2", "not-yours", "checkpoint.committed", "another job's")
        if not fixed:
            raise TransientError("storage down")
        seen.append(event.data.checkpoint_id)

    await bus.broker.start()
    try:
        original = committed("signed-1")
        await producer.publish(original)
        await producer.publish(committed("not-yours", key="n"))
        found = await letters_of(settings, 2)
        assert sorted(str(d.code) for d in found) == ["job_mismatch", "max_deliver"]
        fixed = True
        cfg = settings.bus()
        nc = await nats.connect(settings.nats_url)
        try:
            js = nc.jetstream()
            since = datetime.now(UTC) - timedelta(minutes=5)
            select = dead_letters.Selection(since=since, consumer="replay-test--commits")
            report = await dead_letters.replay(js, cfg, select, actor="t", now=datetime.now(UTC))
            [replayed] = report.replayed
            assert [d.code for d in report.never] == ["job_mismatch"]
            await wait_for(lambda: _async("signed-1" in seen), what="the replay handled")
            again = await dead_letters.replay(js, cfg, select, actor="t", now=datetime.now(UTC))
            later = dead_letters.Selection(since=datetime.now(UTC))
            none = await dead_letters.replay(js, cfg, later, actor="t", now=datetime.now(UTC))
        finally:
            await nc.close()
    finally:
        await bus.broker.stop()
    assert seen == ["signed-1"]
    assert (again.replayed, [d.seq for d in again.already]) == ([], [replayed.seq])
    assert (none.replayed, none.already, none.never) == ([], [], [])  # nothing since then
    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    [copy] = [m for m in msgs if (m.headers or {}).get("Ckpt-Replayed-From")]
    assert copy.data == original.to_bytes()
    first = next(m for m in msgs if m.data == original.to_bytes())
    assert (copy.headers or {})["Ckpt-Signature"] == (first.headers or {})["Ckpt-Signature"]
    assert not any(k.startswith("Ckpt-Error") for k in copy.headers or {})
    # Only the one dead letter still waiting for the fix went back, never the refusal.
    assert await count_events(settings, b'"checkpoint_id":"not-yours"') == 1


async def _async(value: bool) -> bool:
    return value
