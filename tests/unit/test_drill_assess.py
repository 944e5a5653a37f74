"""The drill's five levels come each from their own evidence; none is inferred."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointQuarantinedV1,
    CheckpointRegisteredV1,
    CheckpointVerifiedV1,
)
from ckpt_ha.contracts.job import FailureCause, JobFailedV1, JobProgressV1, JobStartedV1
from ckpt_ha.contracts.resume import (
    Comparison,
    Compatibility,
    ResumeClosedV1,
    ResumeLoadedV1,
    ResumeMode,
    ResumePlannedV2,
    ResumeVerifiedV1,
)
from ckpt_ha.lab.drill.assess import LEVELS, assess_restore, judged, manual_actions, reclaimed
from tests.support.events import T0

J = "drill-job"


def ev(data: EventData, seconds: float) -> Envelope[EventData]:
    return build(data, source="test", time=T0 + timedelta(seconds=seconds), key=str(seconds))


def story() -> dict[str, Envelope[EventData]]:
    c = {"job_id": J, "checkpoint_id": "c20", "uri": "file:///s/drill-job/step-20"}
    plan = {"job_id": J, "plan_id": "p1"}
    return {
        "generated": ev(CheckpointCommittedV1(**c, run_id="r", step=20,
                                              format=CheckpointFormat.NATIVE), 1),
        "verified": ev(CheckpointVerifiedV1(**c, checks=("sizes", "a.bin=xxh3_64:00ff")), 2),
        "registered": ev(CheckpointRegisteredV1(**c, step=20, project="p"), 3),
        "failed": ev(JobFailedV1(job_id=J, run_id="r", cause=FailureCause.NODE_EXIT,
                                 signal=9, last_step=27), 10),
        "planned": ev(ResumePlannedV2(**plan, failed_run_id="r", attempt=2, checkpoint_id="c20",
                                      checkpoint_uri=c["uri"], step=20,
                                      mode=ResumeMode.EXACT,
                                      compatibility=Compatibility.IDENTICAL,
                                      recompute_steps=7), 11),
        "started": ev(JobStartedV1(job_id=J, run_id="r", attempt=2, plan_id="p1"), 11.5),
        "loadable": ev(ResumeLoadedV1(**plan, run_id="r", checkpoint_id="c20", step=20,
                                      load_seconds=0.2), 12),
        "progress": ev(JobProgressV1(job_id=J, run_id="r", attempt=2, step=21, plan_id="p1",
                                     metrics={"loss": 0.5}), 13),
        "continued": ev(ResumeVerifiedV1(**plan, run_id="r", checkpoint_id="c20", step=21,
                                         comparisons=(Comparison(name="loss", expected=0.5,
                                                                 observed=0.5, ok=True),)), 14),
    }  # fmt: skip


def test_a_full_restore_passes_every_level_with_its_own_evidence() -> None:
    s = story()
    result = assess_restore("node-exit", list(s.values()), J, s["failed"].time).to_json()
    assert result["verdict"] == "pass"
    assert result["restored_from"] == "c20"
    assert result["last_valid_checkpoint"] == "c20"
    assert (result["continue_step"], result["recompute_steps"]) == (21, 7)
    for name in LEVELS:
        assert result["levels"][name]["passed"], name
        assert result["levels"][name]["evidence"]["event_id"] == s[name].id
    assert result["levels"]["verified"]["evidence"]["checksums"] == ["a.bin=xxh3_64:00ff"]
    assert [line["t_seconds"] for line in result["timeline"]][:2] == [-9.0, -8.0]
    assert any("job.failed" in line["what"] for line in result["timeline"])
    durations = result["durations"]
    assert (durations["detect"], durations["plan"], durations["relaunch"]) == (0.0, 1.0, 0.5)
    assert (durations["load"], durations["compute"], durations["verdict"]) == (0.5, 1.0, 1.0)
    assert durations["total"] == 4.0
    assert durations["control_plane"] == 2.5
    assert durations["control_plane_share"] == 0.625


@pytest.mark.parametrize("missing", LEVELS)
def test_a_missing_level_fails_alone(missing: str) -> None:
    s = story()
    del s[missing]
    result = assess_restore("node-exit", list(s.values()), J, s["failed"].time).to_json()
    assert result["verdict"] == "fail"
    assert not result["levels"][missing]["passed"]
    others = [n for n in LEVELS if n != missing]
    assert all(result["levels"][n]["passed"] for n in others)
    assert f"level {missing} not proven" in result["reasons"]


def test_no_plan_means_nothing_is_proven() -> None:
    s = story()
    del s["planned"]
    result = assess_restore("node-exit", list(s.values()), J, s["failed"].time).to_json()
    assert result["verdict"] == "fail"
    assert result["restored_from"] is None
    assert "no resume.planned after the fault" in result["reasons"]


def test_reclaimed_resources_and_manual_actions_come_from_their_events() -> None:
    s = story()
    closed = ev(ResumeClosedV1(job_id=J, plan_id="p1", cleaned=("file:///s/j/step-30",),
                               unreclaimable=("file:///s/j/step-40",)), 15)  # fmt: skip
    by_hand = build(
        CheckpointQuarantinedV1(job_id=J, checkpoint_id="c20", uri="u", reason="r", actor="al"),
        source="ckpt-ha/cli",
        time=T0,
        key="manual",
    )
    events = [*s.values(), closed, by_hand]
    got = reclaimed(events, J)
    assert got == {
        "cleaned": ["file:///s/j/step-30"],
        "unreclaimable": ["file:///s/j/step-40"],
        "event_ids": [closed.id],
    }
    assert reclaimed(events, "other-job")["event_ids"] == []
    [action] = manual_actions(events, J)
    assert (action["event_id"], action["actor"]) == (by_hand.id, "al")
    assert manual_actions(list(s.values()), J) == []


def test_a_drill_passes_when_its_phases_passed_and_every_check_is_met() -> None:
    s = story()

    def result() -> dict[str, Any]:
        return assess_restore("node-exit", list(s.values()), J, s["failed"].time).to_json()

    passed = judged(result(), {"a": True, "b": True}, phases=True)
    assert (passed["verdict"], passed["reasons"]) == ("pass", [])
    assert passed["checks"] == {"a": True, "b": True}
    failed = judged(result(), {"a": False, "b": True}, phases=True)
    assert (failed["verdict"], failed["reasons"]) == ("fail", ["not met: a"])
    assert judged(result(), {"a": True}, phases=False)["verdict"] == "fail"
