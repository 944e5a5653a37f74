"""Fault drills against the embedded stack: run the example job under `ckpt-ha run`, inject one
fault, let the system restore it, and read back what happened from the event stream.

One scenario per module under `ckpt_ha.lab.drill.scenarios`; the shared harness is
`ckpt_ha.lab.drill.harness`, the evidence every drill records is `ckpt_ha.lab.drill.evidence`,
and what the evidence proves is decided in `ckpt_ha.lab.drill.assess`, purely.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckpt_ha.lab.devstack import stack
from ckpt_ha.lab.drill import assess, evidence, report
from ckpt_ha.lab.drill.assess import Assessment
from ckpt_ha.lab.drill.harness import DRILL_ENV, Drill, DrillFailed
from ckpt_ha.lab.drill.scenarios import (
    EXPECTED_ALERTS,
    FAULTS,
    IN_ALL,
    SCENARIOS,
    missing_packages,
)
from ckpt_ha.runtime import local_stack


def _run_one(scenario: str, home: Path, state: local_stack.StackState, log: Callable[[str], None],
             budget_s: float, number: str) -> dict[str, Any]:  # fmt: skip
    job = f"drill-{scenario}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}"
    drill = Drill(home=home, state=state, job=job, budget_s=budget_s, log=log,
                  scenario=f"{number}{scenario}")  # fmt: skip
    drill.progress(f"job {job}: {FAULTS[scenario]}")
    try:
        result = asyncio.run(SCENARIOS[scenario](drill))
    except DrillFailed as exc:
        result = {
            "scenario": scenario,
            "verdict": "fail",
            "stopped": True,
            "job": job,
            "reasons": [f"stopped: {exc}"],
            "levels": {},
            "last_valid_checkpoint": None,
            "restored_from": None,
            "continue_step": None,
            "recompute_steps": None,
            "timeline": [],
        }
    events = asyncio.run(drill.events())
    result["baseline"] = drill.workload.baseline(drill.job_args)
    result["fault"] = FAULTS[scenario]
    result["elapsed_seconds"] = round(time.monotonic() - drill.started, 2)
    result["curves"] = {
        "baseline": drill.workload.baseline_losses(drill.job_args) if drill.job_args else [],
        "drill": evidence.drill_losses(drill.runner_log),
    }
    result["marks"] = assess.marks(events, job, drill.faults)
    result["resources_reclaimed"] = assess.reclaimed(events, job)
    result["manual_actions"] = assess.manual_actions(events, job)
    result["metrics_after"] = evidence.metrics_after(state, job)
    result["alerts_fired"] = evidence.alerts_fired(state, job, EXPECTED_ALERTS.get(scenario))
    expected = EXPECTED_ALERTS.get(scenario)
    if expected is not None and result["alerts_fired"]["available"]:
        fired = result["alerts_fired"]["alerts"]
        alerted = fired.get(expected, {}).get("state") == "firing"
        result.setdefault("checks", {})[f"alerted ({expected})"] = alerted
        if not alerted:
            result["verdict"] = "fail"
            result.setdefault("reasons", []).append(f"not met: alerted ({expected})")
    drill.progress(f"{result['verdict'].upper()} in {result['elapsed_seconds']:.0f}s")
    return result


def run(scenario: str, home: Path, env: Mapping[str, str], log: Callable[[str], None],
        budget_s: float = 300.0, storage: str | None = None,
        ) -> dict[str, Any] | list[dict[str, Any]]:  # fmt: skip
    """Start the embedded stack if none runs, run one scenario (its JSON result) or ``all`` of
        them in turn on that stack (a list of results; ``all`` leaves out the drills that need a
    system package bootstrap does not install: ``slurm-node-lost``). ``budget_s`` bounds each
    drill.

        ``storage``: the stack's storage root (a path or ``s3://bucket/prefix``; default: the
        running stack's, else ``CKPT_HA_STORAGE_ROOT``, else ``<home>/storage``). On S3 the stack
        reaches the server of ``AWS_ENDPOINT_URL`` through its storage link, which the
        storage-outage drill cuts. A running stack on another root is a `stack.StackConflict`."""
    state = local_stack.StackState.load(home)
    if state is None or not all(s.alive for s in stack.status(state)):
        log(f"starting the embedded stack under {home}")
        root = {"CKPT_HA_STORAGE_ROOT": storage} if storage else {}
        state = stack.up(home, {**env, **DRILL_ENV, **root}, storage_link=True)
    elif storage and state.storage_root != storage:
        raise stack.StackConflict(
            f"the running stack under {home} uses the storage root {state.storage_root}, not "
            f"{storage}: `ckpt-ha down` first"
        )
    log(f"storage root: {state.storage_root}")
    if scenario != "all":
        return _run_or_say_why(scenario, home, state, log, budget_s, "")
    names = list(IN_ALL)
    return [
        _run_or_say_why(name, home, state, log, budget_s, f"{i}/{len(names)} ")
        for i, name in enumerate(names, 1)
    ]


NOT_RUN = "not_run"
"""The verdict of a drill this installation cannot run (its framework is not installed)."""


def _run_or_say_why(scenario: str, home: Path, state: local_stack.StackState,
                    log: Callable[[str], None], budget_s: float,
                    number: str) -> dict[str, Any]:  # fmt: skip
    missing = missing_packages(scenario)
    if not missing:
        return _run_one(scenario, home, state, log, budget_s, number)
    why = (
        f"not run: its training job needs {', '.join(missing)}, which this installation lacks "
        "(install the torch and hf extras: scripts/bootstrap --frameworks, or "
        "pip install 'ckpt-ha[torch,hf]')"
    )
    log(f"[{number}{scenario}] {why}")
    return {"scenario": scenario, "verdict": NOT_RUN, "job": None, "fault": FAULTS[scenario],
            "reasons": [why], "levels": {}, "timeline": []}  # fmt: skip


def as_json(result: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> str:
    return json.dumps(result, indent=2, default=str)


def as_text(result: Mapping[str, Any]) -> str:
    """The drill's story for a person: timeline, then the five levels and the verdict."""
    lines = [f"drill {result['scenario']} on job {result.get('job')}: {result['verdict'].upper()}"]
    for phase in result.get("phases") or [result]:
        lines.append("")
        lines.append(f"-- {phase['scenario']}")
        for t in phase.get("timeline", []):
            at = t["t_seconds"]
            when = f"{at:+9.2f}s" if at is not None else " " * 10
            lines.append(f"  {when}  {t['what']}")
        lines.append(f"  last valid checkpoint: {phase.get('last_valid_checkpoint')}")
        lines.append(f"  restored from:         {phase.get('restored_from')}")
        lines.append(f"  continue step:         {phase.get('continue_step')}")
        lines.append(f"  recompute steps:       {phase.get('recompute_steps')}")
        if phase.get("durations"):
            d = phase["durations"]
            lines.append(
                f"  fault → resume.verified {d['total']:.2f}s: control plane "
                f"{d['control_plane']:.2f}s ({100 * d['control_plane_share']:.0f}%: detect "
                f"{d['detect']:.2f}, plan {d['plan']:.3f}, relaunch {d['relaunch']:.2f}, verdict "
                f"{d['verdict']:.3f}), job {d['load'] + d['compute']:.2f}s (load {d['load']:.2f},"
                f" compute {d['compute']:.2f})"
            )
        for name, level in (phase.get("levels") or {}).items():
            evidence = report.as_text(level.get("evidence") or {})
            lines.append(f"  {report.level_mark(phase, name):<12}  {name:<10} {evidence[:200]}")
    fired = result.get("alerts_fired") or {}
    if fired.get("available"):
        alerts = fired["alerts"].items()
        names = ", ".join(f"{n} ({a['state']}, {a['severity']})" for n, a in alerts)
        lines.append(f"alerts for the job: {names or 'none'}")
    elif fired:
        lines.append(f"alerts: not recorded ({fired.get('why')})")
    if "manual_actions" in result:
        lines.append(f"manual actions: {len(result['manual_actions']) or 'none'}")
    lines.extend(f"reason: {reason}" for reason in result.get("reasons", []))
    return "\n".join(lines)


__all__ = ["EXPECTED_ALERTS", "FAULTS", "SCENARIOS", "Assessment", "run"]
