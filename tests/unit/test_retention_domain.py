"""Retention decisions (pure): tier rules, every protection, grace, tiers and their resolution."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import (
    CheckpointPinnedV1,
    CheckpointState,
    CheckpointUnpinnedV1,
    TierChosenV1,
)
from ckpt_ha.core.job_records import UnknownTierChosen, tier_record
from ckpt_ha.core.record_notes import PinRefused, pin
from ckpt_ha.core.records import CheckpointRecord, Expiry, PinRecord, project
from ckpt_ha.core.tiers import DEFAULT_TIER, TIERS, KeepBest, Tier, get_tier, resolve_tier
from ckpt_ha.retention_janitor.domain import (
    SETTLE,
    Action,
    Decision,
    JobView,
    Protection,
    ProtectionKind,
    plan,
    plan_job,
    unknown_objects,
)
from tests.support.events import T0, committed, deleted, expired, verified

S = CheckpointState
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)

# A strict tier: keep only the newest valid checkpoint, nothing else, no grace.
STRICT = Tier(
    name="strict",
    cost=0,
    interval_s=60,
    keep_last=1,
    keep_every=None,
    keep_best=None,
    max_age_s=None,
    quarantine_keep_s=0,
    failed_keep_s=0,
    grace_s=0,
    replicate=False,
)


def rec(
    cid: str,
    step: int,
    state: S = S.VALID,
    *,
    age_days: float = 1,
    metrics: dict[str, float] | None = None,
    pins: tuple[PinRecord, ...] = (),
    grace_until: datetime | None = None,
) -> CheckpointRecord:
    at = NOW - timedelta(days=age_days)
    expiry = None
    if state is S.EXPIRED:
        expiry = Expiry(reason="r", policy="p", grace_until=grace_until, actor="j", at=at)
    return CheckpointRecord(
        checkpoint_id=cid,
        job_id="job-1",
        step=step,
        uri=f"file:///data/job-1/step-{step}",
        state=state,
        created_at=at,
        updated_at=at,
        metrics=metrics or {},
        pins=pins,
        expiry=expiry,
    )


def by_id(decisions: list[Decision]) -> dict[str, Decision]:
    return {d.checkpoint_id: d for d in decisions}


def job(*records: CheckpointRecord, tier: Tier = STRICT, protections=()) -> JobView:  # type: ignore[no-untyped-def]
    return JobView("job-1", tier, records, tuple(protections))


def test_keep_last_expires_older_valid_and_names_the_rule() -> None:
    d = by_id(plan_job(job(rec("a", 100), rec("b", 200), rec("c", 300)), NOW))
    assert d["c"].action is Action.KEEP
    assert d["b"].action is Action.EXPIRE
    assert d["a"].action is Action.EXPIRE
    assert "newest 1 valid" in d["b"].reason
    assert d["b"].grace_until == NOW
    assert d["b"].policy.startswith("strict: keep_last=1")


def test_keep_every_and_keep_best_and_max_age() -> None:
    tier = replace(
        STRICT, keep_every=1000, keep_best=KeepBest("val_loss", "min", 1), max_age_s=10 * 86400
    )
    records = [
        rec("s1000", 1000, age_days=5),
        rec("s1500", 1500, age_days=4, metrics={"val_loss": 0.1}),
        rec("s1700", 1700, age_days=3, metrics={"val_loss": 0.5}),
        rec("s2000-old", 2000, age_days=20),  # a multiple, but older than max_age
        rec("s2100", 2100, age_days=1),
    ]
    d = by_id(plan_job(job(*records, tier=tier), NOW))
    assert d["s2100"].action is Action.KEEP  # keep_last (and last valid)
    assert d["s1000"].action is Action.KEEP
    assert "keep_every" in d["s1000"].reason
    assert d["s1500"].action is Action.KEEP
    assert "keep_best" in d["s1500"].reason
    assert d["s1700"].action is Action.EXPIRE
    assert d["s2000-old"].action is Action.EXPIRE


def test_keep_best_max_direction() -> None:
    tier = replace(STRICT, keep_best=KeepBest("acc", "max", 1))
    records = [rec("lo", 1, metrics={"acc": 0.2}), rec("hi", 2, metrics={"acc": 0.9}), rec("n", 3)]
    d = by_id(plan_job(job(*records, tier=tier), NOW))
    assert d["hi"].action is Action.KEEP
    assert d["lo"].action is Action.EXPIRE


PROTECTIONS = [
    (ProtectionKind.PIN, None),
    (ProtectionKind.RESTORE_PLAN, Protection("old", ProtectionKind.RESTORE_PLAN, "plan p1")),
    (ProtectionKind.RESUME, Protection("old", ProtectionKind.RESUME, "attempt 2 of plan p1")),
    (ProtectionKind.FALLBACK, Protection("old", ProtectionKind.FALLBACK, "fallback for p1")),
]


@pytest.mark.parametrize(("kind", "external"), PROTECTIONS, ids=[k.value for k, _ in PROTECTIONS])
@pytest.mark.parametrize(
    "state", [S.VALID, S.QUARANTINED, S.CORRUPT, S.WRITE_FAILED, S.EXPIRED, S.FENCED]
)
def test_every_protection_holds_when_every_rule_says_expire(
    kind: ProtectionKind, external: Protection | None, state: S
) -> None:
    pins = ()
    if kind is ProtectionKind.PIN:
        pins = (PinRecord(by="eval:mmlu", reason="r", actor="a", at=NOW, event_id="e"),)
    # Old, superseded, past every retention and (if expired) past its grace period.
    old = rec("old", 1, state, age_days=400, pins=pins, grace_until=NOW - timedelta(days=1))
    view = job(old, rec("new", 9), protections=[external] if external else [])
    [d] = [x for x in plan_job(view, NOW) if x.checkpoint_id == "old"]
    assert d.action is Action.KEEP
    assert [p.kind for p in d.protected_by] == [kind]
    assert kind.value in d.reason
    # Without the protection the same checkpoint goes.
    bare = job(replace_pins(old), rec("new", 9))
    [d2] = [x for x in plan_job(bare, NOW) if x.checkpoint_id == "old"]
    assert d2.action is (Action.DELETE if state is S.EXPIRED else Action.EXPIRE)


def replace_pins(r: CheckpointRecord) -> CheckpointRecord:
    return r.model_copy(update={"pins": ()})


def test_last_valid_is_never_expired_even_if_old_and_superseded_by_broken_ones() -> None:
    records = [
        rec("valid", 10, age_days=1000),
        rec("q", 20, S.QUARANTINED, age_days=400),
        rec("f", 30, S.WRITE_FAILED, age_days=400),
        rec("z", 40, S.FENCED, age_days=400),
    ]
    tier = replace(STRICT, keep_last=0, max_age_s=1)
    d = by_id(plan_job(job(*records, tier=tier), NOW))
    assert d["valid"].action is Action.KEEP
    assert [p.kind for p in d["valid"].protected_by] == [ProtectionKind.LAST_VALID]
    assert d["q"].action is Action.EXPIRE
    assert "quarantine retention" in d["q"].reason
    assert d["f"].action is Action.EXPIRE
    assert "partial write" in d["f"].reason
    assert d["z"].action is Action.EXPIRE  # a fenced commit: kept as long as a quarantined one
    assert "fenced for longer" in d["z"].reason


def test_grace_period_then_delete() -> None:
    later = NOW + timedelta(hours=1)
    d = by_id(plan_job(job(rec("x", 1, S.EXPIRED, grace_until=later), rec("n", 2)), NOW))
    assert d["x"].action is Action.WAIT
    assert d["x"].grace_until == later
    d = by_id(plan_job(job(rec("x", 1, S.EXPIRED, grace_until=later), rec("n", 2)), later))
    assert d["x"].action is Action.DELETE


def test_quarantine_and_failed_kept_within_retention_and_in_flight_untouched() -> None:
    tier = replace(STRICT, quarantine_keep_s=3 * 86400, failed_keep_s=3 * 86400)
    records = [
        rec("q", 1, S.QUARANTINED, age_days=1),
        rec("f", 2, S.WRITE_FAILED, age_days=1),
        rec("w", 3, S.WRITING, age_days=300),
        rec("p", 4, S.PENDING_VERIFICATION, age_days=300),
    ]
    d = by_id(plan_job(job(*records, tier=tier), NOW))
    assert {k: v.action for k, v in d.items()} == dict.fromkeys("qfwp", Action.KEEP)


def test_deleted_records_are_not_planned_and_plan_is_deterministic() -> None:
    view = job(rec("gone", 1, S.DELETED), rec("a", 2), rec("b", 3))
    first = plan([view], NOW)
    assert "gone" not in by_id(first)
    assert plan([view], NOW) == first


def test_unknown_objects() -> None:
    keys = ["job-1/step-1/a", "job-1/step-10/a", "quarantine/job-1/step-2/x", "stray/file"]
    known = ["job-1/step-1", "quarantine/job-1/step-2"]
    assert unknown_objects(keys, known) == ["job-1/step-10/a", "stray/file"]


# --- tiers -------------------------------------------------------------------------------------


def test_default_tier_is_the_cheapest_and_tiers_are_ordered() -> None:
    assert DEFAULT_TIER == "exploratory"
    assert TIERS["exploratory"].cost < TIERS["standard"].cost < TIERS["critical"].cost
    assert TIERS["critical"].replicate
    assert not TIERS["exploratory"].replicate
    assert TIERS["critical"].keep_last > TIERS["exploratory"].keep_last
    with pytest.raises(ValueError, match="unknown tier"):
        get_tier("platinum")


def test_tier_resolution_explicit_choice_wins_and_unknown_never_goes_up() -> None:
    assert resolve_tier(None, None).tier.name == "exploratory"
    assert resolve_tier(None, None).source == "default"
    assert resolve_tier(None, "standard").tier.name == "standard"
    assert resolve_tier(None, "standard").source == "declared"
    unknown = resolve_tier(None, "platinum")
    assert (unknown.tier.name, unknown.source) == ("exploratory", "default")
    chosen = resolve_tier({"tier": "critical", "actor": "alice", "reason": "deadline"}, "standard")
    assert (chosen.tier.name, chosen.source) == ("critical", "chosen")
    assert "alice" in chosen.detail
    assert "deadline" in chosen.detail


def test_tier_choice_is_recorded_and_unknown_refused() -> None:
    ok = build(
        TierChosenV1(job_id="j", tier="critical", reason="r", actor="alice"),
        source="cli",
        time=T0,
        key="1",
    )
    record = tier_record(ok)
    assert (record.tier, record.actor, record.reason, record.at) == ("critical", "alice", "r", T0)
    bad = build(
        TierChosenV1(job_id="j", tier="gold", reason="r", actor="a"), source="c", time=T0, key="2"
    )
    with pytest.raises(UnknownTierChosen):
        tier_record(bad)


# --- pins and tombstones in the projection ------------------------------------------------------


def _pin(cid: str, by: str = "eval:mmlu", key: str = "p") -> object:
    return build(
        CheckpointPinnedV1(
            job_id="job-1", checkpoint_id=cid, uri="file:///x", by=by, reason="eval", actor="bob"
        ),
        source="ckpt-ha/cli",
        time=T0 + timedelta(hours=1),
        key=key,
    )


def test_pin_unpin_projection_records_actor_and_keeps_state() -> None:
    record = None
    for event in (committed("c1"), verified("c1")):
        record, _ = project(record, event)
    pinned, step = project(record, _pin("c1"))  # type: ignore[arg-type]
    assert step is None
    assert pinned is not None
    assert pinned.state is S.VALID
    assert [(p.by, p.actor) for p in pinned.pins] == [("eval:mmlu", "bob")]
    assert pinned.history[-1].event_type == "checkpoint.pinned"
    assert "pinned by eval:mmlu" in (pinned.history[-1].reason or "")
    unpin = build(
        CheckpointUnpinnedV1(
            job_id="job-1", checkpoint_id="c1", uri="file:///x", by="eval:mmlu", reason="done",
            actor="bob",
        ),
        source="ckpt-ha/cli",
        time=T0 + timedelta(hours=2),
        key="u",
    )  # fmt: skip
    released, _ = project(pinned, unpin)
    assert released is not None
    assert released.pins == ()


def test_pin_refused_on_unknown_or_deleted() -> None:
    with pytest.raises(PinRefused, match="not in the registry"):
        pin(None, _pin("c1"))  # type: ignore[arg-type]
    record = None
    for event in (committed("c1"), verified("c1"), expired("c1"), deleted("c1")):
        record, _ = project(record, event)
    with pytest.raises(PinRefused, match="deleted"):
        pin(record, _pin("c1"))  # type: ignore[arg-type]


def test_expiry_and_tombstone_fields() -> None:
    record = None
    for event in (committed("c1"), verified("c1"), expired("c1"), deleted("c1")):
        record, _ = project(record, event)
    assert record is not None
    assert record.expiry is not None
    assert record.expiry.policy == "standard"
    assert record.tombstone is not None
    assert (record.tombstone.reason, record.tombstone.actor) == ("age", "janitor")
    assert record.uri == "file:///data/job-1/step-100"


def test_nothing_expires_within_the_settle_time_of_its_last_transition() -> None:
    young = [
        rec(c, s, age_days=SETTLE.total_seconds() / 86400 / 2) for c, s in (("a", 1), ("b", 2))
    ]
    failed = rec("f", 3, S.WRITE_FAILED, age_days=0.001)
    d = by_id(plan_job(job(*young, failed), NOW))
    assert {k: v.action for k, v in d.items()} == dict.fromkeys("abf", Action.KEEP)
    d = by_id(plan_job(job(*young, failed), NOW + SETTLE))
    assert d["a"].action is Action.EXPIRE
    assert d["f"].action is Action.EXPIRE
