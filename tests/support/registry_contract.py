"""The behaviour every checkpoint registry (`ckpt_ha.registry.port.CheckpointRegistry`) must
show, written once and run against each: the in-memory fake and the Redis adapter.

Subclass `RegistryContract` in a `Test*` class and give it a `registry` fixture that returns an
empty registry; pytest then runs every test below against that implementation.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointPinnedV1,
    CheckpointState,
    CheckpointUnpinnedV1,
    CheckpointWriteFailedV1,
    FailureSide,
    OwnershipTransferredV1,
    TierChosenV1,
)
from ckpt_ha.core.errors import DependencyNotReady
from ckpt_ha.core.job_records import OwnershipMismatch, UnknownTierChosen
from ckpt_ha.core.lifecycle import IllegalTransition
from ckpt_ha.core.record_notes import PinRefused
from ckpt_ha.core.records import Applied
from tests.support.events import T0, committed, deleted, expired, planned, verified

S = CheckpointState


def event(data: EventData, key: str = "k", seconds: int = 10) -> Envelope[EventData]:
    return build(data, source="test/contract", time=T0 + timedelta(seconds=seconds), key=key)


def write_failed(ckpt: str, job: str = "job-1") -> Envelope[EventData]:
    return event(
        CheckpointWriteFailedV1(
            job_id=job,
            checkpoint_id=ckpt,
            uri="file:///x",
            reason="rank died",
            side=FailureSide.JOB,
        )
    )


def tier(job: str, name: str, key: str = "k") -> Envelope[EventData]:
    return event(TierChosenV1(job_id=job, tier=name, reason="deadline", actor="alice"), key=key)


def transfer(job: str, frm: str | None, to: str, key: str = "k") -> Envelope[EventData]:
    data = OwnershipTransferredV1(
        job_id=job, from_project=frm, to_project=to, reason="reorg", actor="bob"
    )
    return event(data, key=key)


def pinned(ckpt: str, by: str, *, unpin: bool = False, key: str = "k") -> Envelope[EventData]:
    kind = CheckpointUnpinnedV1 if unpin else CheckpointPinnedV1
    data = kind(
        job_id="job-1", checkpoint_id=ckpt, uri="file:///x", by=by, reason="eval", actor="carol"
    )
    return event(data, key=key)


class RegistryContract:
    @pytest.fixture
    def registry(self) -> Any:
        raise NotImplementedError("implementation test classes provide the registry")

    # --- lifecycle -------------------------------------------------------------------------------

    async def test_committed_then_verified_is_valid_with_its_history(self, registry: Any) -> None:
        first = await registry.apply(committed("c1", step=7))
        assert isinstance(first, Applied)
        assert (first.duplicate, first.transition.previous, first.transition.new) == (
            False,
            None,
            S.PENDING_VERIFICATION,
        )
        ev = verified("c1", step=7)
        second = await registry.apply(ev)
        record = await registry.get("c1")
        assert record == second.record
        assert record.state is S.VALID
        assert (record.step, record.job_id, record.uri) == (7, "job-1", "file:///data/job-1/step-7")
        assert [h.state for h in record.history] == [S.PENDING_VERIFICATION, S.VALID]
        assert record.history[-1].event_id == ev.id
        assert await registry.indexed_states("c1") == [S.VALID]

    async def test_an_unknown_checkpoint_is_none(self, registry: Any) -> None:
        assert await registry.get("nope") is None
        assert await registry.by_job("nobody") == []
        assert await registry.latest_valid("nobody") is None
        assert await registry.jobs() == []

    async def test_a_repeated_event_is_a_no_op(self, registry: Any) -> None:
        ev = committed("c1")
        await registry.apply(ev)
        again = await registry.apply(ev)
        assert again.duplicate is True
        assert again.transition is None
        record = await registry.get("c1")
        assert again.record == record
        assert len(record.history) == 1

    async def test_a_late_report_of_an_earlier_stage_changes_nothing(self, registry: Any) -> None:
        await registry.apply(committed("c1", key="watcher"))
        await registry.apply(verified("c1"))
        late = await registry.apply(committed("c1", key="writer"))
        assert (late.duplicate, late.transition.changed) == (False, False)
        assert (await registry.get("c1")).state is S.VALID

    # --- fencing (R17) ---------------------------------------------------------------------------

    async def test_a_plan_fences_older_attempts_of_its_run(self, registry: Any) -> None:
        await registry.apply(committed("before", step=10, attempt=1, key="b"))
        await registry.apply(planned(attempt=2))
        assert await registry.planned_attempt("job-1", "run-1") == 2
        assert await registry.planned_attempt("job-1", "run-2") is None
        zombie = await registry.apply(committed("zombie", step=20, attempt=1, key="z"))
        assert zombie.transition.changed
        record = await registry.get("zombie")
        assert (record.state, record.fenced_by) == (S.FENCED, 2)
        assert "attempt 1" in record.history[-1].reason
        # The commit handled before the plan stays as it was, and may still become valid.
        await registry.apply(committed("before", step=10, attempt=1, key="b2"))
        await registry.apply(verified("before", step=10))
        assert (await registry.get("before")).state is S.VALID
        # The planned attempt itself is not fenced; a late verdict on the zombie moves nothing.
        await registry.apply(committed("resumed", step=20, attempt=2, key="r"))
        assert (await registry.get("resumed")).state is S.PENDING_VERIFICATION
        await registry.apply(verified("zombie", step=20))
        assert (await registry.get("zombie")).state is S.FENCED
        assert [r.checkpoint_id for r in await registry.by_state(S.FENCED)] == ["zombie"]

    async def test_a_fence_only_rises_and_applies_within_one_batch(self, registry: Any) -> None:
        results = await registry.apply_many(
            [planned(attempt=3, key="p3"), planned(attempt=2, key="p2"),
             committed("z", attempt=2, key="z")]
        )  # fmt: skip
        assert all(not isinstance(r, Exception) for r in results)
        assert await registry.planned_attempt("job-1", "run-1") == 3
        assert (await registry.get("z")).state is S.FENCED

    async def test_an_illegal_transition_is_refused_and_changes_nothing(
        self, registry: Any
    ) -> None:
        await registry.apply(committed("c1"))
        await registry.apply(write_failed("c1"))
        with pytest.raises(IllegalTransition):
            await registry.apply(verified("c1"))
        record = await registry.get("c1")
        assert record.state is S.WRITE_FAILED
        assert await registry.indexed_states("c1") == [S.WRITE_FAILED]

    async def test_a_verdict_before_its_commit_waits(self, registry: Any) -> None:
        with pytest.raises(DependencyNotReady):
            await registry.apply(verified("c1"))
        assert await registry.get("c1") is None

    async def test_a_batch_reports_each_events_outcome_and_applies_the_rest(
        self, registry: Any
    ) -> None:
        c = committed("c1")
        results = await registry.apply_many([verified("c2"), c, c, verified("c1")])
        assert isinstance(results[0], DependencyNotReady)
        assert isinstance(results[1], Applied)
        assert not results[1].duplicate
        assert isinstance(results[2], Applied)
        assert results[2].duplicate
        assert isinstance(results[3], Applied)
        assert results[3].record.state is S.VALID
        assert (await registry.get("c1")).state is S.VALID
        assert await registry.get("c2") is None

    async def test_a_mixed_batch_settles_every_event_on_its_own(self, registry: Any) -> None:
        """One batch (one read, one write) holding an event applied before, an illegal
        transition, a verdict before its commit, a repeat within the batch, a second checkpoint
        at a location, an ownership transfer and a plan that fences a later commit: each gets
        its own outcome, and only the ones that apply change the registry."""
        await registry.apply(committed("old", step=1, key="o"))
        await registry.apply(committed("failed", step=2, key="f"))
        await registry.apply(write_failed("failed"))
        new = committed("new", step=3, key="n")
        results = await registry.apply_many(
            [
                committed("old", step=1, key="o"),  # applied before: a duplicate
                verified("failed", step=2),  # write_failed -> valid: illegal
                new,
                verified("ghost", step=9),  # no commit yet: waits
                new,  # the same event again within the batch
                committed("twin", step=3, key="t"),  # the location of "new"
                transfer("job-1", None, "proj-a", key="x"),
                planned(attempt=2, key="p"),
                committed("zombie", step=4, attempt=1, key="z"),
            ]
        )
        dup, illegal, fresh, waits, again, twin, moved, plan, zombie = results
        assert isinstance(dup, Applied)
        assert dup.duplicate
        assert isinstance(illegal, IllegalTransition)
        assert isinstance(fresh, Applied)
        assert not fresh.duplicate
        assert isinstance(waits, DependencyNotReady)
        assert isinstance(again, Applied)
        assert again.duplicate
        assert isinstance(twin, Applied)
        assert twin.others_at_uri == ("new",)
        assert isinstance(moved, Applied)
        assert moved.owner == "proj-a"
        assert isinstance(plan, Applied)
        assert isinstance(zombie, Applied)
        assert zombie.record.state is S.FENCED
        assert (await registry.get("failed")).state is S.WRITE_FAILED
        assert await registry.get("ghost") is None
        assert (await registry.get("new")).state is S.PENDING_VERIFICATION
        assert [r.checkpoint_id for r in await registry.by_uri(new.data.uri)] == ["new", "twin"]
        assert await registry.owner("job-1") == "proj-a"
        assert await registry.planned_attempt("job-1", "run-1") == 2
        # The whole batch again: every event that applied is a duplicate now, the refused
        # ones are refused again, and nothing changes.
        before = await registry.get("new")
        again_results = await registry.apply_many([new, verified("failed", step=2)])
        assert isinstance(again_results[0], Applied)
        assert again_results[0].duplicate
        assert isinstance(again_results[1], IllegalTransition)
        assert await registry.get("new") == before

    async def test_expiry_and_deletion_keep_a_tombstone(self, registry: Any) -> None:
        await registry.apply(committed("c1"))
        await registry.apply(verified("c1"))
        await registry.apply(expired("c1"))
        await registry.apply(deleted("c1"))
        record = await registry.get("c1")
        assert record.state is S.DELETED
        assert record.expiry is not None
        assert record.expiry.policy == "standard"
        assert record.tombstone is not None
        assert record.tombstone.actor == "janitor"

    # --- reads and indexes -----------------------------------------------------------------------

    async def test_reads_by_job_state_uri_and_jobs(self, registry: Any) -> None:
        for ckpt, step in (("a", 10), ("b", 30), ("c", 20)):
            await registry.apply(committed(ckpt, step=step))
        await registry.apply(committed("x", job="job-2", step=1))
        await registry.apply(verified("a", step=10))
        await registry.apply(verified("c", step=20))

        assert [r.checkpoint_id for r in await registry.by_job("job-1")] == ["b", "c", "a"]
        valid = await registry.by_job("job-1", state=S.VALID)
        assert [r.checkpoint_id for r in valid] == ["c", "a"]
        assert (await registry.latest_valid("job-1")).checkpoint_id == "c"
        assert [r.checkpoint_id for r in await registry.by_state(S.VALID)] == ["a", "c"]
        pending = await registry.by_state(S.PENDING_VERIFICATION)
        assert [r.checkpoint_id for r in pending] == ["b", "x"]
        by_uri = await registry.by_uri("file:///data/job-1/step-30")
        assert [r.checkpoint_id for r in by_uri] == ["b"]
        assert await registry.jobs() == ["job-1", "job-2"]

    async def test_pages_of_a_job_newest_first(self, registry: Any) -> None:
        for step in range(5):
            await registry.apply(committed(f"c{step}", step=step))
        pages = [[r.checkpoint_id for r in p] async for p in registry.by_job_pages("job-1", 2)]
        assert pages == [["c4", "c3"], ["c2", "c1"], ["c0"]]
        assert [p async for p in registry.by_job_pages("nobody", 2)] == []

    async def test_the_newest_of_many_jobs_at_once(self, registry: Any) -> None:
        """`newest_of_jobs` (a burst's selections): each job's first page, read at once."""
        for step in range(3):
            await registry.apply(committed(f"c{step}", step=step))
        await registry.apply(committed("d0", job="job-2"))
        found = await registry.newest_of_jobs(["job-1", "job-2", "nobody"], 2)
        assert {j: [r.checkpoint_id for r in rs] for j, rs in found.items()} == {
            "job-1": ["c2", "c1"],
            "job-2": ["d0"],
            "nobody": [],
        }
        assert await registry.newest_of_jobs([], 2) == {}

    async def test_a_second_checkpoint_at_one_uri_is_kept_apart_and_reported(
        self, registry: Any
    ) -> None:
        uri = "file:///data/job-1/step-100"
        await registry.apply(committed("old", uri=uri))
        creator = committed("new", uri=uri)
        second = await registry.apply(creator)
        assert second.others_at_uri == ("old",)
        assert [r.checkpoint_id for r in await registry.by_uri(uri)] == ["new", "old"]
        # A redelivered creator reports its conflict again (its publish may have been lost).
        again = await registry.apply(creator)
        assert (again.duplicate, again.others_at_uri) == (True, ("old",))

    # --- ownership (R5) --------------------------------------------------------------------------

    async def test_the_first_identity_naming_a_project_claims_the_job(self, registry: Any) -> None:
        first = await registry.apply(committed("c1", project="vision"))
        assert first.owner == "vision"
        await registry.apply(committed("c2", step=200, project="nlp"))  # no silent re-claim
        assert await registry.owner("job-1") == "vision"
        assert await registry.jobs_of("vision") == ["job-1"]
        [claim] = await registry.owner_log("job-1")
        assert (claim.from_project, claim.to_project) == (None, "vision")

    async def test_a_transfer_moves_the_job_and_is_logged(self, registry: Any) -> None:
        await registry.apply(committed("c1", project="vision"))
        moved = await registry.apply(transfer("job-1", "vision", "nlp"))
        assert moved.owner == "nlp"
        assert await registry.owner("job-1") == "nlp"
        assert (await registry.jobs_of("vision"), await registry.jobs_of("nlp")) == ([], ["job-1"])
        log = await registry.owner_log("job-1")
        assert [(e.from_project, e.to_project, e.actor) for e in log] == [
            (None, "vision", "test/watcher"),
            ("vision", "nlp", "bob"),
        ]

    async def test_a_stale_transfer_is_refused(self, registry: Any) -> None:
        await registry.apply(committed("c1", project="vision"))
        with pytest.raises(OwnershipMismatch):
            await registry.apply(transfer("job-1", "audio", "nlp"))
        assert await registry.owner("job-1") == "vision"

    # --- tiers (R13) ----------------------------------------------------------------------------

    async def test_a_chosen_tier_wins_over_the_declared_one(self, registry: Any) -> None:
        assert (await registry.tier_of("job-9")).source == "default"
        await registry.declare_tier("job-9", "standard")
        assert await registry.declared_tier("job-9") == "standard"
        assert (await registry.tier_of("job-9")).tier.name == "standard"
        await registry.apply(tier("job-9", "critical"))
        await registry.apply(tier("job-9", "exploratory", key="k2"))
        choice = await registry.tier_of("job-9")
        assert (choice.tier.name, choice.source) == ("exploratory", "chosen")
        assert [t.tier for t in await registry.tier_log("job-9")] == ["critical", "exploratory"]
        assert (await registry.chosen_tier("job-9")).actor == "alice"
        assert await registry.jobs() == ["job-9"]
        await registry.declare_tier("job-9", None)
        assert await registry.declared_tier("job-9") is None

    async def test_an_unknown_tier_is_refused(self, registry: Any) -> None:
        with pytest.raises(UnknownTierChosen):
            await registry.apply(tier("job-9", "platinum"))
        assert await registry.chosen_tier("job-9") is None

    # --- pins (R6) ------------------------------------------------------------------------------

    async def test_pins_are_kept_in_the_record(self, registry: Any) -> None:
        await registry.apply(committed("c1"))
        await registry.apply(pinned("c1", "eval-suite"))
        record = await registry.get("c1")
        assert [p.by for p in record.pins] == ["eval-suite"]
        assert record.state is S.PENDING_VERIFICATION
        await registry.apply(pinned("c1", "eval-suite", unpin=True, key="k2"))
        assert (await registry.get("c1")).pins == ()

    async def test_a_pin_on_an_unknown_checkpoint_is_refused(self, registry: Any) -> None:
        with pytest.raises(PinRefused):
            await registry.apply(pinned("ghost", "eval-suite"))

    # --- reconcile log --------------------------------------------------------------------------

    async def test_the_reconcile_log_keeps_entries_in_order(self, registry: Any) -> None:
        assert await registry.reconcile_log() == []
        await registry.record_reconcile_deletion({"key": "a/b", "actor": "ops"})
        await registry.record_reconcile_deletion({"key": "c/d", "actor": "ops"})
        assert await registry.reconcile_log() == [
            {"key": "a/b", "actor": "ops"},
            {"key": "c/d", "actor": "ops"},
        ]
