"""The restore-coordinator's pure decisions: compatibility (R14), selection, recompute range,
stop conditions (R9), continuity (R10), pins (R15) and leftovers (R11)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_ha.contracts.checkpoint import (
    CheckpointIdentity,
    CheckpointState,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import CompatibilityRule, JobPolicy, Tolerance
from ckpt_ha.contracts.resume import Compatibility, ResumeMode
from ckpt_ha.restore_coordinator import domain
from ckpt_ha.restore_coordinator.domain import (
    Candidate,
    Failure,
    History,
    Pin,
    Point,
    Stop,
    Target,
)

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
ENV = RuntimeEnvironment(
    framework="torch",
    framework_version="2.3.0",
    python_version="3.11.9",
    image="trainer:1",
    libraries={"numpy": "1.26.4"},
)
TOPO = Topology(world_size=8, tensor_parallel=2, pipeline_parallel=1)


def ident(
    env: RuntimeEnvironment | None = ENV,
    topo: Topology | None = TOPO,
    code: str | None = "abc",
    attempt: int = 1,
) -> CheckpointIdentity:
    return CheckpointIdentity(
        job_id="j", run_id="r", attempt=attempt, environment=env, topology=topo, code_version=code
    )


TARGET = Target(ENV, TOPO, "abc")


def policy(**kw: object) -> JobPolicy:
    return JobPolicy.model_validate(kw)


# --- compatibility (R14) ---


def test_identical_identity_is_an_exact_resume() -> None:
    v = domain.compatibility(ident(), TARGET, policy())
    assert (v.compatibility, v.mode, v.reasons) == (Compatibility.IDENTICAL, ResumeMode.EXACT, ())


def test_missing_on_both_sides_is_equal() -> None:
    v = domain.compatibility(ident(env=None, topo=None, code=None), Target(), policy())
    assert v.compatibility is Compatibility.IDENTICAL
    v = domain.compatibility(None, Target(), policy())
    assert v.compatibility is Compatibility.IDENTICAL


@pytest.mark.parametrize(
    ("written", "target", "field"),
    [
        (ident(), Target(ENV.model_copy(update={"framework_version": "2.4.0"}), TOPO, "abc"),
         "framework_version"),
        (ident(), Target(ENV.model_copy(update={"python_version": "3.12.1"}), TOPO, "abc"),
         "python_version"),
        (ident(), Target(ENV.model_copy(update={"image": "trainer:2"}), TOPO, "abc"), "image"),
        (ident(), Target(ENV.model_copy(update={"framework": "jax"}), TOPO, "abc"), "framework"),
        (ident(), Target(ENV, TOPO, "def"), "code_version"),
        (ident(), Target(ENV, Topology(world_size=16, tensor_parallel=2), "abc"), "topology"),
        (ident(), Target(ENV.model_copy(update={"libraries": {"numpy": "2.0.0"}}), TOPO, "abc"),
         "libraries.numpy"),
        (ident(), Target(ENV.model_copy(update={"libraries": {}}), TOPO, "abc"), "libraries.numpy"),
        (ident(env=None), TARGET, "framework_version"),  # missing on the checkpoint's side
        (ident(), Target(None, TOPO, "abc"), "framework_version"),  # missing on the target's
        (ident(topo=None), TARGET, "topology"),
        (ident(code=None), TARGET, "code_version"),
    ],
)  # fmt: skip
def test_an_undeclared_difference_is_unknown_and_never_resumed(
    written: CheckpointIdentity, target: Target, field: str
) -> None:
    v = domain.compatibility(written, target, policy())
    assert v.compatibility is Compatibility.UNKNOWN
    assert v.mode is None
    assert any(r.startswith(f"{field}:") and "no declared rule" in r for r in v.reasons)
    weights = domain.compatibility(written, target, policy(allow_weights_only=True))
    assert weights.compatibility is Compatibility.UNKNOWN
    assert weights.mode is ResumeMode.WEIGHTS_ONLY
    assert any("NOT a job resume" in r for r in weights.reasons)


NEW_FW = Target(ENV.model_copy(update={"framework_version": "2.4.0"}), TOPO, "abc")


@pytest.mark.parametrize(
    ("rule", "allowed"),
    [
        (CompatibilityRule(field="framework_version", written="2.3.0", target="2.4.0"), True),
        (CompatibilityRule(field="framework_version", written="*", target="2.4.0"), True),
        (CompatibilityRule(field="framework_version", written="2.3.0", target="*"), True),
        (CompatibilityRule(field="framework_version"), True),
        (CompatibilityRule(field="framework_version", written="2.2.0", target="2.4.0"), False),
        (CompatibilityRule(field="framework_version", written="2.3.0", target="2.5.0"), False),
        (CompatibilityRule(field="framework_version", written="2.4.0", target="2.3.0"), False),
        (CompatibilityRule(field="python_version"), False),
    ],
)
def test_declared_rules_make_a_difference_a_compatible_resume(
    rule: CompatibilityRule, allowed: bool
) -> None:
    v = domain.compatibility(ident(), NEW_FW, policy(compatible=[rule]))
    if allowed:
        assert (v.compatibility, v.mode) == (
            Compatibility.DECLARED_COMPATIBLE,
            ResumeMode.COMPATIBLE,
        )
        assert v.reasons == (
            f"framework_version: 2.3.0 -> 2.4.0 (declared: framework_version "
            f"{rule.written} -> {rule.target})",
        )
    else:
        assert (v.compatibility, v.mode) == (Compatibility.UNKNOWN, None)


def test_every_difference_needs_a_rule() -> None:
    target = Target(
        ENV.model_copy(update={"framework_version": "2.4.0", "libraries": {"numpy": "2.0.0"}}),
        Topology(world_size=4, tensor_parallel=2),
        "abc",
    )
    one = policy(compatible=[CompatibilityRule(field="framework_version")])
    assert domain.compatibility(ident(), target, one).compatibility is Compatibility.UNKNOWN
    rules = [
        CompatibilityRule(field="framework_version"),
        CompatibilityRule(field="libraries.numpy", written="1.26.4", target="2.0.0"),
        CompatibilityRule(field="topology", written="8/2/1", target="4/2/1"),
    ]
    v = domain.compatibility(ident(), target, policy(compatible=rules))
    assert v.compatibility is Compatibility.DECLARED_COMPATIBLE
    assert len(v.reasons) == 3


def test_star_matches_a_missing_value_but_a_literal_does_not() -> None:
    star = policy(compatible=[CompatibilityRule(field="image")])
    no_image = Target(ENV.model_copy(update={"image": None}), TOPO, "abc")
    assert (
        domain.compatibility(ident(), no_image, star).compatibility
        is Compatibility.DECLARED_COMPATIBLE
    )
    literal = policy(compatible=[CompatibilityRule(field="image", written="trainer:1", target="")])
    assert domain.compatibility(ident(), no_image, literal).compatibility is Compatibility.UNKNOWN


def test_weights_only_checkpoint_cannot_resume_a_job() -> None:
    v = domain.compatibility(ident(), TARGET, policy(), training_state=False)
    assert (v.compatibility, v.mode) == (Compatibility.IDENTICAL, None)
    v = domain.compatibility(ident(), TARGET, policy(allow_weights_only=True), training_state=False)
    assert v.mode is ResumeMode.WEIGHTS_ONLY


# --- selection ---


def cand(cid: str, step: int, state: CheckpointState = CheckpointState.VALID) -> Candidate:
    return Candidate(checkpoint_id=cid, step=step, uri=f"file:///x/{cid}", state=state)


def test_select_newest_valid_and_the_previous_one_skipping_excluded_and_invalid() -> None:
    rows = [
        cand("c5", 500, CheckpointState.WRITING),
        cand("c4", 400, CheckpointState.QUARANTINED),
        cand("c3", 300),
        cand("c2", 200, CheckpointState.CORRUPT),
        cand("c1", 100),
        cand("c0", 50),
    ]
    s = domain.select(rows)
    assert (s.chosen and s.chosen.checkpoint_id, s.previous and s.previous.checkpoint_id) == (
        "c3",
        "c1",
    )
    s = domain.select(rows, excluded={"c3"})
    assert (s.chosen and s.chosen.checkpoint_id, s.previous and s.previous.checkpoint_id) == (
        "c1",
        "c0",
    )
    s = domain.select(rows, excluded={"c3", "c1", "c0"})
    assert (s.chosen, s.previous) == (None, None)


def test_plan_id_is_deterministic_per_failure() -> None:
    assert domain.plan_id("j", "r", 1) == domain.plan_id("j", "r", 1)
    assert domain.plan_id("j", "r", 1) != domain.plan_id("j", "r", 2)
    assert domain.plan_id("j", "r", 1) != domain.plan_id("j", "r2", 1)


# --- recompute ---


def test_recompute_from_the_checkpoint_step_report_to_the_last_progress() -> None:
    last = Point(step=180, at=T0 + timedelta(seconds=90))
    steps, seconds = domain.recompute(
        checkpoint_step=100,
        checkpoint_at=T0 + timedelta(seconds=10),
        last_progress=last,
        failed_step=None,
        failed_at=T0 + timedelta(seconds=120),
    )
    assert (steps, seconds) == (80, 80.0)


def test_recompute_uses_the_failures_step_and_time_without_progress() -> None:
    steps, seconds = domain.recompute(
        checkpoint_step=100,
        checkpoint_at=T0,
        last_progress=None,
        failed_step=130,
        failed_at=T0 + timedelta(seconds=45),
    )
    assert (steps, seconds) == (30, 45.0)
    assert domain.recompute(
        checkpoint_step=100,
        checkpoint_at=None,
        last_progress=None,
        failed_step=None,
        failed_at=T0,
    ) == (0, 0.0)
    # Never negative (clock skew, a checkpoint newer than the last report).
    assert domain.recompute(
        checkpoint_step=100,
        checkpoint_at=T0 + timedelta(seconds=5),
        last_progress=Point(step=90, at=T0),
        failed_step=None,
        failed_at=T0,
    ) == (0, 0.0)


# --- stop conditions (R9) ---


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_no_history_goes_on() -> None:
    assert domain.stop_reason(History(), policy(), T0) is None


def test_restart_loop_counts_restores_within_the_window() -> None:
    p = policy(max_restarts=3, restart_window_s=600)
    three = History(restarts=[at(0), at(100), at(200)])
    stop = domain.stop_reason(three, p, at(300))
    assert stop is not None
    assert stop.reason == Stop.RESTART_LOOP
    assert stop.next_step.startswith("docs/RUNBOOK.md#stop-runaway-retries")
    two = History(restarts=[at(100), at(200)])
    assert domain.stop_reason(two, p, at(300)) is None
    # The oldest left the window.
    assert domain.stop_reason(three, p, at(700)) is None
    assert domain.stop_reason(History(), policy(max_restarts=0), T0) is not None


def test_same_failure_signature_repeating() -> None:
    p = policy(max_same_failure=3)
    same = [Failure(a, at(a), "oom:137") for a in (1, 2, 3)]
    stop = domain.stop_reason(History(failures=same), p, at(10))
    assert stop is not None
    assert stop.reason == Stop.SAME_FAILURE
    broken = [Failure(1, at(1), "oom:137"), Failure(2, at(2), "x"), *same[2:]]
    assert domain.stop_reason(History(failures=broken), p, at(10)) is None
    unsigned = [Failure(a, at(a), None) for a in (1, 2, 3)]
    assert domain.stop_reason(History(failures=unsigned), p, at(10)) is None


def test_storage_errors_growing() -> None:
    p = policy(max_storage_errors=2, restart_window_s=60)
    stop = domain.stop_reason(History(storage_errors=[at(0), at(30)]), p, at(50))
    assert stop is not None
    assert stop.reason == Stop.STORAGE_ERRORS
    assert stop.next_step.startswith("docs/RUNBOOK.md#check-storage")
    assert domain.stop_reason(History(storage_errors=[at(0), at(30)]), p, at(70)) is None


def test_fallbacks_exhausted_only_on_a_load_failure() -> None:
    p = policy(max_fallbacks=2)
    h = History(fallbacks=2)
    stop = domain.stop_reason(h, p, T0, load_failed=True)
    assert stop is not None
    assert stop.reason == Stop.FALLBACKS_EXHAUSTED
    assert domain.stop_reason(History(fallbacks=1), p, T0, load_failed=True) is None
    assert domain.stop_reason(h, p, T0) is None
    assert domain.stop_reason(History(), policy(max_fallbacks=0), T0, load_failed=True)


def test_every_stop_reason_names_a_runbook_anchor_that_exists() -> None:
    runbook = (Path(__file__).parents[2] / "docs" / "RUNBOOK.md").read_text()
    for reason in Stop:
        step = domain.Escalation(reason, "").next_step
        assert step.startswith("docs/RUNBOOK.md#"), step
        anchor = step.removeprefix("docs/RUNBOOK.md#").split(":")[0]
        assert f'<a id="{anchor}"></a>' in runbook, anchor


# --- continuity (R10) ---


def pt(step: int, loss: float = 1.0, dp: int | None = None, rng: str | None = "r") -> Point:
    return Point(
        step=step,
        at=at(step),
        data_position=step * 32 if dp is None else dp,
        rng_fingerprint=rng,
        metrics={"loss": loss},
    )


TRAJ = {s: pt(s, loss=2.0 - s / 1000) for s in range(100, 201)}
LOSS = policy(tolerances=[Tolerance(metric="loss", abs=0.01, rel=0.05)], continuity_steps=3)


def run(observed: list[Point], p: JobPolicy = LOSS, restored: int = 150) -> domain.Continuity:
    return domain.continuity(restored_step=restored, trajectory=TRAJ, observed=observed, policy=p)


def test_equal_progress_is_verified_after_the_declared_number_of_reports() -> None:
    assert run([]).verdict == domain.PENDING
    assert run([TRAJ[151]]).verdict == domain.PENDING
    assert run([TRAJ[151], TRAJ[152]]).verdict == domain.PENDING
    result = run([TRAJ[151], TRAJ[152], TRAJ[153]])
    assert result.verdict == domain.VERIFIED
    assert result.step == 153
    assert all(c.ok for c in result.comparisons)
    names = [c.name for c in result.comparisons]
    assert names[0] == "first step"
    assert "step 151: data_position" in names
    assert "step 151: rng_fingerprint" in names
    assert "step 153: loss" in names


def test_the_restored_step_itself_may_come_first() -> None:
    assert run([TRAJ[150]], policy()).verdict == domain.VERIFIED


@pytest.mark.parametrize("first", [149, 152, 0, 1000])
def test_any_other_first_step_is_divergence(first: int) -> None:
    result = run([pt(first)])
    assert result.verdict == domain.DIVERGED
    assert "first progress at step" in result.reason
    assert not result.comparisons[0].ok


def test_metric_tolerance_abs_plus_rel() -> None:
    expected = TRAJ[151].metrics["loss"]  # 1.849
    allowed = 0.01 + 0.05 * expected
    inside = pt(151, loss=expected + allowed * 0.99)
    outside = pt(151, loss=expected + allowed * 1.01)
    assert run([inside], policy(tolerances=LOSS.tolerances)).verdict == domain.VERIFIED
    result = run([outside], policy(tolerances=LOSS.tolerances))
    assert result.verdict == domain.DIVERGED
    [bad] = [c for c in result.comparisons if not c.ok]
    assert bad.name == "step 151: loss"
    assert bad.tolerance == pytest.approx(allowed)
    assert "step 151: loss" in result.reason
    only_abs = policy(tolerances=[Tolerance(metric="loss", abs=0.5)])
    assert run([pt(151, loss=expected + 0.49)], only_abs).verdict == domain.VERIFIED
    assert run([pt(151, loss=expected - 0.51)], only_abs).verdict == domain.DIVERGED
    only_rel = policy(tolerances=[Tolerance(metric="loss", rel=0.1)])
    assert run([pt(151, loss=expected * 1.09)], only_rel).verdict == domain.VERIFIED
    assert run([pt(151, loss=expected * 1.11)], only_rel).verdict == domain.DIVERGED


def test_zero_tolerance_means_exact() -> None:
    exact = policy(tolerances=[Tolerance(metric="loss")])
    assert run([TRAJ[151]], exact).verdict == domain.VERIFIED
    off = pt(151, loss=TRAJ[151].metrics["loss"] + 1e-9)
    assert run([off], exact).verdict == domain.DIVERGED


def test_a_missing_declared_metric_diverges() -> None:
    missing = Point(step=151, at=at(151), data_position=151 * 32, rng_fingerprint="r")
    assert run([missing], policy(tolerances=LOSS.tolerances)).verdict == domain.DIVERGED


def test_data_position_and_rng_must_match_exactly() -> None:
    one = policy()
    assert run([pt(151, dp=151 * 32 + 1)], one).verdict == domain.DIVERGED
    assert run([pt(151, rng="other")], one).verdict == domain.DIVERGED
    no_position = Point(step=151, at=at(151), rng_fingerprint="r")
    assert run([no_position], one).verdict == domain.DIVERGED


def test_a_bad_later_report_diverges_before_the_count_is_reached() -> None:
    result = run([TRAJ[151], pt(152, dp=1)])
    assert result.verdict == domain.DIVERGED
    assert result.step == 152


def test_steps_the_trajectory_does_not_know_are_skipped() -> None:
    sparse = {s: TRAJ[s] for s in (100, 160, 200)}
    observed = [TRAJ[151], TRAJ[155], TRAJ[160]]
    result = domain.continuity(
        restored_step=150, trajectory=sparse, observed=observed, policy=policy()
    )
    assert result.verdict == domain.VERIFIED
    assert result.step == 160


def test_past_the_end_of_the_old_trajectory_verifies_what_was_compared() -> None:
    result = domain.continuity(restored_step=200, trajectory=TRAJ, observed=[pt(201)], policy=LOSS)
    assert result.verdict == domain.VERIFIED
    assert result.reason == "no pre-failure progress at the resumed steps"


# --- pins (R15) and leftovers (R11) ---


def test_pins_hold_the_restored_and_the_previous_checkpoint() -> None:
    sel = domain.select([cand("c3", 300), cand("c1", 100)])
    pins = domain.pins_for("p", 2, sel)
    assert [(p.checkpoint_id, p.reason, p.restored_step, p.attempt) for p in pins] == [
        ("c3", "restored from", 300, 2),
        ("c1", "fallback", 300, 2),
    ]
    assert domain.pins_for("p", 2, domain.select([])) == []


def test_unpin_only_for_a_newer_checkpoint_of_the_resumed_attempt() -> None:
    pins = [Pin("c3", "restored from", "p", 300, 2), Pin("c1", "fallback", "p", 300, 2)]
    assert domain.to_unpin(pins, registered_step=300, registered_attempt=2) == []
    assert domain.to_unpin(pins, registered_step=400, registered_attempt=1) == []
    assert domain.to_unpin(pins, registered_step=400, registered_attempt=2) == ["c1", "c3"]
    assert domain.to_unpin(pins, registered_step=400, registered_attempt=None) == ["c1", "c3"]


def test_leftovers_are_the_failed_attempts_partial_checkpoints() -> None:
    def row(
        cid: str,
        state: CheckpointState,
        run: str = "r",
        attempt: int | None = None,
        created: datetime = T0,
    ) -> Candidate:
        identity = ident(attempt=attempt) if attempt is not None else None
        return Candidate(
            checkpoint_id=cid,
            step=1,
            uri=f"file:///x/{cid}",
            state=state,
            identity=identity,
            created_at=created,
            run_id=run,
        )

    rows = [
        row("writing", CheckpointState.WRITING),
        row("failed", CheckpointState.WRITE_FAILED, attempt=1),
        row("valid", CheckpointState.VALID),
        row("other-run", CheckpointState.WRITING, run="r2"),
        row("other-attempt", CheckpointState.WRITE_FAILED, attempt=2),
        row("after", CheckpointState.WRITING, created=T0 + timedelta(hours=1)),
    ]
    found = domain.leftovers(rows, run_id="r", attempt=1, failed_at=T0 + timedelta(minutes=1))
    assert [c.checkpoint_id for c in found] == ["writing", "failed"]


def test_a_jobs_event_acts_only_on_its_own_checkpoint_and_plan() -> None:
    assert domain.foreign("job-a", "c1", "resume.load_failed") is None
    assert domain.foreign("job-a", "c1", "x", record_job="job-a", plan_job="job-a") is None
    for kwargs in ({"record_job": "job-b"}, {"plan_job": "job-b"}):
        refused = domain.foreign("job-a", "c1", "resume.load_failed", **kwargs)
        assert refused is not None
        assert (refused.code, refused.job_id, refused.checkpoint_id) == (
            "job_mismatch",
            "job-a",
            "c1",
        )
    plan = domain.PlanRecord(
        plan_id="p", job_id="job-b", failed_run_id="r", failed_attempt=1, attempt=2,
        checkpoint_id="c1", step=1, failed_at=datetime(2026, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    assert domain.own_plan(plan, "job-b") == plan
    assert domain.own_plan(plan, "job-a") is None
