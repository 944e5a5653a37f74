"""Manual actions through the real CLI process, a real registrar, NATS and Redis: quarantine,
release and ownership transfer, each recorded with actor, time and reason; identity and project
bound at registration; a second checkpoint id at one location reported as a conflict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointState, OwnershipTransferredV1
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.cli_tools import cli
from tests.support.events import T0, committed, verified

pytestmark = pytest.mark.integration


async def events_of(settings: ServiceSettings, event_type: str) -> list[dict[str, object]]:
    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    docs = [json.loads(m.data) for m in msgs]
    return [d for d in docs if d["type"].rsplit(".v", 1)[0] == f"ckpt-ha.{event_type}"]


async def make_valid(registrar: Registrar, producer: Bus, ckpt: str, project: str) -> None:
    await producer.publish(committed(ckpt, step=100, project=project))
    await producer.publish(verified(ckpt, step=100))

    async def valid() -> bool:
        rec = await registrar.registry.get(ckpt)
        return rec is not None and rec.state is CheckpointState.VALID

    await wait_for(valid, what=f"{ckpt} valid")


async def test_registration_binds_identity_and_owning_project(
    registrar: Registrar, producer: Bus, settings: ServiceSettings
) -> None:
    await make_valid(registrar, producer, "c1", project="vision")
    registered = await wait_for(
        lambda: events_of(settings, "checkpoint.registered"), what="registered event"
    )
    data = registered[0]["data"]
    assert isinstance(data, dict)
    assert data["project"] == "vision"
    assert data["identity"]["job_id"] == "job-1"
    assert data["identity"]["run_id"] == "run-1"
    assert data["identity"]["code_version"] == "abc123"
    assert data["identity"]["project"] == "vision"
    assert await registrar.registry.owner("job-1") == "vision"
    assert await registrar.registry.jobs_of("vision") == ["job-1"]
    [claim] = await registrar.registry.owner_log("job-1")
    assert (claim.from_project, claim.to_project) == (None, "vision")


async def test_quarantine_and_release_are_recorded_with_actor_and_reason(
    registrar: Registrar, producer: Bus, settings: ServiceSettings, tmp_path: Path
) -> None:
    await make_valid(registrar, producer, "c1", project="vision")

    code, out, err = await cli(
        settings, tmp_path, "quarantine", "c1", "--reason", "loss spiked", "--actor", "alice"
    )
    assert code == 0, err
    assert "valid -> quarantined by alice" in out
    rec = await registrar.registry.get("c1")
    assert rec is not None
    assert rec.state is CheckpointState.QUARANTINED
    last = rec.history[-1]
    assert (last.actor, last.reason) == ("alice", "loss spiked")
    assert last.at.tzinfo is not None

    code, out, err = await cli(settings, tmp_path, "quarantine", "c1", "--reason", "again")
    assert code == 4  # refused
    assert err.strip() == "ckpt-ha: checkpoint c1 is already quarantined"

    code, out, err = await cli(
        settings, tmp_path, "release", "c1", "--reason", "loss spike was data", "--actor", "bob"
    )
    assert code == 0, err
    rec = await registrar.registry.get("c1")
    assert rec is not None
    # Back to verification: valid again only with fresh integrity evidence.
    assert rec.state is CheckpointState.PENDING_VERIFICATION
    assert (rec.history[-1].actor, rec.history[-1].reason) == ("bob", "loss spike was data")
    assert [h.state for h in rec.history] == [
        CheckpointState.PENDING_VERIFICATION,
        CheckpointState.VALID,
        CheckpointState.QUARANTINED,
        CheckpointState.PENDING_VERIFICATION,
    ]

    code, _, err = await cli(settings, tmp_path, "release", "c1", "--reason", "x", "--actor", "b")
    assert code == 4
    assert "not quarantined" in err
    code, _, err = await cli(settings, tmp_path, "quarantine", "nope", "--reason", "x")
    assert (code, err.strip()) == (1, "ckpt-ha: no checkpoint 'nope' in the registry")


@pytest.mark.parametrize(
    "args",
    [
        ["quarantine", "c1"],
        ["quarantine", "c1", "--reason", "  "],
        ["release", "c1", "--reason", "two\nlines"],
        ["owner", "transfer", "--from", "a", "--reason", "r"],
    ],
)
async def test_bad_arguments_are_one_line_usage_errors(
    settings: ServiceSettings, tmp_path: Path, args: list[str]
) -> None:
    code, _out, err = await cli(settings, tmp_path, *args)
    assert code == 2
    assert err.startswith("ckpt-ha: ")
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


async def test_owner_transfer_is_recorded_and_refuses_a_stale_owner(
    registrar: Registrar, producer: Bus, settings: ServiceSettings, tmp_path: Path
) -> None:
    await make_valid(registrar, producer, "c1", project="vision")

    code, out, err = await cli(
        settings,
        tmp_path,
        "owner", "transfer", "--from", "vision", "--to", "nlp",
        "--reason", "team reorganised", "--actor", "carol",
    )  # fmt: skip
    assert code == 0, err
    assert "job-1: vision -> nlp (by carol)" in out
    assert await registrar.registry.owner("job-1") == "nlp"
    assert await registrar.registry.jobs_of("vision") == []

    code, out, err = await cli(settings, tmp_path, "owner", "show", "--job", "job-1", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["owner"] == "nlp"
    assert [(e["from_project"], e["to_project"], e["actor"]) for e in shown["log"]] == [
        (None, "vision", "test/watcher"),
        ("vision", "nlp", "carol"),
    ]
    assert shown["log"][1]["reason"] == "team reorganised"

    code, _, err = await cli(
        settings, tmp_path, "owner", "transfer", "--from", "vision", "--to", "x", "--reason", "r"
    )
    assert code == 4
    assert "no jobs owned by vision" in err

    # A transfer that names an owner the job no longer has (raced with another) is refused by
    # the registrar itself and dead-lettered; ownership does not move.
    stale = build(
        OwnershipTransferredV1(
            job_id="job-1", from_project="vision", to_project="x", reason="r", actor="dave"
        ),
        source="test/tool",
        time=T0,
        key="stale",
    )
    await producer.publish(stale)

    async def dead() -> list[object]:
        msgs = await stream_messages(settings.nats_url, settings.dead_letter_stream)
        return [m for m in msgs if (m.headers or {}).get("Ckpt-Error-Code") == "ownership_mismatch"]

    await wait_for(dead, timeout=15, what="ownership_mismatch dead letter")
    assert await registrar.registry.owner("job-1") == "nlp"
    # A later checkpoint naming the old project does not silently re-claim the job.
    await make_valid(registrar, producer, "c2", project="vision")
    assert await registrar.registry.owner("job-1") == "nlp"


async def test_second_checkpoint_at_one_location_is_a_conflict_and_both_stay(
    registrar: Registrar, producer: Bus, settings: ServiceSettings
) -> None:
    uri = "file:///data/job-1/step-100"
    await producer.publish(committed("first", uri=uri))
    await producer.publish(committed("second", uri=uri, key="resubmitted"))
    conflicts = await wait_for(
        lambda: events_of(settings, "checkpoint.conflict"), what="conflict event"
    )
    [data] = [c["data"] for c in conflicts]
    assert isinstance(data, dict)
    assert data["checkpoint_id"] == "second"
    assert data["existing_checkpoint_id"] == "first"
    assert uri in data["reason"]
    ids = sorted(r.checkpoint_id for r in await registrar.registry.by_uri(uri))
    assert ids == ["first", "second"]
