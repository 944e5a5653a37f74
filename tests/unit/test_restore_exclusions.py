"""R7 per location (issue 29): a load failure rules out the location the bytes were read from
(the primary or one copy), so the same checkpoint is restored from a verified copy before an
older checkpoint; only when every location of it is excluded or invalid is it passed over."""

from __future__ import annotations

from datetime import UTC, datetime

from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.contracts.resume import Compatibility, ResumeMode, ResumePlannedV2
from ckpt_ha.restore_coordinator import domain
from ckpt_ha.restore_coordinator.domain import Candidate, Exclusions, exclusion, select
from ckpt_ha.restore_coordinator.records import DecisionRecord, planned_location

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
C1, C2 = "s3://copies/c3", "s3://other/c3"


def cand(
    cid: str,
    step: int,
    state: CheckpointState = CheckpointState.VALID,
    copies: tuple[str, ...] = (),
) -> Candidate:
    return Candidate(cid, step, f"file:///p/{cid}", state, copies=copies)


NEWEST = cand("c3", 30, copies=(C1, C2))
OLDER = cand("c2", 20)


def test_an_exclusion_is_a_whole_checkpoint_or_one_location_of_it() -> None:
    assert exclusion("c3") == "c3"
    found = Exclusions.of([exclusion("c1"), exclusion("c3", C1), exclusion("c3", C2), "[x"])
    assert found.whole == {"c1", "[x"}  # what does not read as a pair is an id, as before
    assert found.at("c3") == {C1, C2}
    assert found.at("c1") == frozenset()
    assert found.everywhere("c1")
    assert not found.everywhere("c3")
    assert found.describe() == ["[x", "c1", f"c3 at {C1}", f"c3 at {C2}"]


def test_a_primary_that_failed_to_load_is_restored_from_its_verified_copy() -> None:
    chosen = select([NEWEST, OLDER], [exclusion("c3", NEWEST.uri)]).chosen
    assert chosen is not None
    assert (chosen.checkpoint_id, chosen.uri) == ("c3", C1)
    assert chosen.source == (
        f"primary {NEWEST.uri} failed to load (excluded after a load failure): restoring from "
        f"its verified copy {C1}"
    )


def test_a_copy_that_failed_too_is_skipped_for_the_next_copy_and_named() -> None:
    excluded = [exclusion("c3", NEWEST.uri), exclusion("c3", C1)]
    sel = select([NEWEST, OLDER], excluded)
    assert sel.chosen is not None
    assert (sel.chosen.checkpoint_id, sel.chosen.uri) == ("c3", C2)
    assert sel.chosen.source is not None
    assert sel.chosen.source.endswith(f"(copies that failed to load before: {C1})")
    assert sel.previous == OLDER


def test_a_copy_that_failed_leaves_a_valid_primary_chosen() -> None:
    chosen = select([NEWEST, OLDER], [exclusion("c3", C1)]).chosen
    assert chosen is not None
    assert (chosen.uri, chosen.copies, chosen.source) == (NEWEST.uri, (C2,), None)


def test_every_location_excluded_falls_back_to_the_older_checkpoint() -> None:
    excluded = [exclusion("c3", u) for u in (NEWEST.uri, C1, C2)]
    sel = select([NEWEST, OLDER], excluded)
    assert sel.chosen == OLDER
    assert sel.previous is None


def test_a_condemned_primary_whose_copies_all_failed_falls_back() -> None:
    quarantined = cand("c3", 30, CheckpointState.QUARANTINED, (C1,))
    assert select([quarantined, OLDER], [exclusion("c3", C1)]).chosen == OLDER


def test_a_whole_checkpoint_exclusion_passes_over_its_copies_too() -> None:
    assert select([NEWEST, OLDER], ["c3"]).chosen == OLDER  # a rollback, an older coordinator


def test_a_load_failure_excludes_the_location_its_plan_loaded() -> None:
    assert domain.load_failure_exclusion("c3", C1) == exclusion("c3", C1)
    assert domain.load_failure_exclusion("c3", None) == "c3"  # location not known: everywhere


def test_the_location_a_plan_loads_is_read_from_its_stored_decision() -> None:
    planned = ResumePlannedV2(
        job_id="j", plan_id="p", failed_run_id="r", attempt=2, checkpoint_id="c3",
        checkpoint_uri=C1, step=30, mode=ResumeMode.EXACT,
        compatibility=Compatibility.IDENTICAL, expected_step=30,
    )  # fmt: skip
    event = build(planned, source="test", time=T0, key="k")
    decision = DecisionRecord(events=(event.model_dump_json(),))
    assert planned_location(decision, "p") == C1
    assert planned_location(decision, "other") is None
    assert planned_location(None, "p") is None


def test_a_failed_load_from_a_copy_never_quarantines_the_primary() -> None:
    assert domain.quarantine_after_load_failure("j", NEWEST, "bad", loaded_from=C1) is None
    at_primary = domain.quarantine_after_load_failure("j", NEWEST, "bad", loaded_from=NEWEST.uri)
    assert at_primary is not None
    assert at_primary.uri == NEWEST.uri
