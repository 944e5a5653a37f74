"""Restore decisions, pure: no I/O, no clock, no Redis. One module per concern, re-exported
here, so handlers and tests read ``domain.<name>``. Each handler fetches, calls one of the
``decide_*`` functions (or `continuity`, `to_unpin`, `leftovers`), persists, publishes.

* `.compatibility` (R14): the checkpoint's identity against the restore target (what the
  failed attempt's ``job.started`` said it runs on), under the job's declared rules; `weigh`
  adds the notes a plan states first.
* `.exclusions` (R7): what load failures ruled out, per location (a primary, a copy) or for a
  whole checkpoint.
* `.selection`: `select` picks the checkpoint to restore and the fallback to keep pinned (R15);
  what a failure waits for (a pending verification, an unregistered commit); fences.
* `.recompute`: what a resume from an older checkpoint costs (R10).
* `.stops` (R9): restart loops, the same failure repeating, fallbacks exhausted, storage faults
  growing → `stop_reason` escalates with the runbook's next step.
* `.continuity` (R10): the resumed attempt's progress against the pre-failure trajectory.
* `.pins`: `leftovers` (R11) and `to_unpin` (R15).
* `.decisions`: `decide_failure` (a plan or an escalation for one failed attempt), what a load
  failure leads to, `verdict_event`, `quarantine_after_load_failure`, `resumed_start`, and
  `ends_the_run` (a failure no restore follows: a user cancelled the job).
* `.reshape` (R14): `replan`, the plan re-stated for the attempt that loads it (or stopped)
  when that attempt starts on another shape than the failed one.
* `.closure`: `closure` of a verified resume (R11) and the refused rollback: what the handlers
  publish.
"""

from __future__ import annotations

from ckpt_ha.core.pins import Pin
from ckpt_ha.restore_coordinator.domain.closure import (
    ACTOR,
    Closure,
    Reclaimed,
    closure,
    refuse_rollback,
)
from ckpt_ha.restore_coordinator.domain.compatibility import (
    MISSING,
    Difference,
    Verdict,
    compatibility,
    differences,
    rule_for,
    target_changes,
    topology_text,
    weigh,
)
from ckpt_ha.restore_coordinator.domain.continuity import (
    DIVERGED,
    PENDING,
    VERIFIED,
    Continuity,
    compare_point,
    continuity,
    within,
)
from ckpt_ha.restore_coordinator.domain.decisions import (
    NO_RESTORE_CAUSES,
    FailureDecision,
    Fallback,
    LoadOutcome,
    after_load_failure,
    cannot_load,
    decide_failure,
    ends_the_run,
    escalated,
    foreign,
    load_failure_exclusion,
    own_plan,
    quarantine_after_load_failure,
    resumed_start,
    verdict_event,
    watches_continuity,
)
from ckpt_ha.restore_coordinator.domain.exclusions import Exclusions, exclusion
from ckpt_ha.restore_coordinator.domain.pins import (
    LEFTOVER_STATES,
    awaits_load_failure,
    leftovers,
    pins_for,
    released_pins,
    to_unpin,
)
from ckpt_ha.restore_coordinator.domain.recompute import (
    recompute,
)
from ckpt_ha.restore_coordinator.domain.reshape import Replan, data_position_note, replan
from ckpt_ha.restore_coordinator.domain.selection import (
    INHERITED,
    PLAN_NAMESPACE,
    Candidate,
    Selection,
    awaits_commit,
    fenced,
    from_copy,
    lacks_identity,
    plan_id,
    restorable,
    select,
    verification_to_await,
    with_inherited_identity,
    within_grace,
    writer_attempt,
)
from ckpt_ha.restore_coordinator.domain.shapes import world_change
from ckpt_ha.restore_coordinator.domain.stops import (
    RUNBOOK,
    Escalation,
    Stop,
    stop_reason,
)
from ckpt_ha.restore_coordinator.records import (
    Failure,
    History,
    PlanRecord,
    Point,
    Started,
    Target,
)

__all__ = [
    "ACTOR",
    "DIVERGED",
    "INHERITED",
    "LEFTOVER_STATES",
    "MISSING",
    "NO_RESTORE_CAUSES",
    "PENDING",
    "PLAN_NAMESPACE",
    "RUNBOOK",
    "VERIFIED",
    "Candidate",
    "Closure",
    "Continuity",
    "Difference",
    "Escalation",
    "Exclusions",
    "Failure",
    "FailureDecision",
    "Fallback",
    "History",
    "LoadOutcome",
    "Pin",
    "PlanRecord",
    "Point",
    "Reclaimed",
    "Replan",
    "Selection",
    "Started",
    "Stop",
    "Target",
    "Verdict",
    "after_load_failure",
    "awaits_commit",
    "awaits_load_failure",
    "cannot_load",
    "closure",
    "compare_point",
    "compatibility",
    "continuity",
    "data_position_note",
    "decide_failure",
    "differences",
    "ends_the_run",
    "escalated",
    "exclusion",
    "fenced",
    "foreign",
    "from_copy",
    "lacks_identity",
    "leftovers",
    "load_failure_exclusion",
    "own_plan",
    "pins_for",
    "plan_id",
    "quarantine_after_load_failure",
    "recompute",
    "refuse_rollback",
    "released_pins",
    "replan",
    "restorable",
    "resumed_start",
    "rule_for",
    "select",
    "stop_reason",
    "target_changes",
    "to_unpin",
    "topology_text",
    "verdict_event",
    "verification_to_await",
    "watches_continuity",
    "weigh",
    "with_inherited_identity",
    "within",
    "within_grace",
    "world_change",
    "writer_attempt",
]
