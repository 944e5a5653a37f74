"""The drill report renders from a stored result alone (pure): Markdown, the JSON `--json`
prints, and a self-contained HTML page whose inline SVG plots baseline against drill losses."""

from __future__ import annotations

import json
import re
from typing import Any

from ckpt_ha.drill import report

LEVELS = ("generated", "verified", "registered", "loadable", "continued")


def stored_result(scenario: str = "node-exit", verdict: str = "pass") -> dict[str, Any]:
    losses = [[s, 1.0 / s] for s in range(1, 31)]
    drill = [[s, 1.0 / s, 1] for s in range(1, 24)] + [[s, 1.0 / s, 2] for s in range(21, 31)]
    return {
        "scenario": scenario,
        "verdict": verdict,
        "job": f"drill-{scenario}-x",
        "levels": {n: {"passed": True, "evidence": {"event_id": f"ev-{n}"}} for n in LEVELS},
        "last_valid_checkpoint": "ck-20",
        "restored_from": "ck-20",
        "continue_step": 21,
        "recompute_steps": 3,
        "timeline": [
            {"t_seconds": -1.5, "what": "checkpoint.registered ck-20 step 20", "event": "e"},
            {"t_seconds": 0.4, "what": "job.failed (node_exit, attempt 1)", "event": "e"},
        ],
        "reasons": [] if verdict == "pass" else ["not met: <the job finished>"],
        "checks": {"the job finished": verdict == "pass"},
        "durations": {
            "detect": 0.3,
            "plan": 0.01,
            "relaunch": 1.0,
            "load": 0.1,
            "compute": 0.5,
            "verdict": 0.01,
            "total": 1.92,
            "control_plane": 1.32,
            "control_plane_share": 0.69,
        },
        "baseline": {
            "model": "mlp",
            "data": "synthetic",
            "config": {"seed": 0},
            "environment": {"python": "3"},
            "resources": {"cpus": 2},
        },
        "fault": "SIGKILL",
        "elapsed_seconds": 12.5,
        "curves": {"baseline": losses, "drill": drill},
        "marks": {
            "checkpoints": [
                {"step": 10, "checkpoint_id": "ck-10"},
                {"step": 20, "checkpoint_id": "ck-20"},
            ],
            "faults": [{"step": 23, "what": "SIGKILL", "time": "t"}],
            "resumes": [{"step": 20, "checkpoint_id": "ck-20", "attempt": 2}],
        },
    }


def test_the_three_files_render_from_a_stored_list_of_results() -> None:
    results = [stored_result(), stored_result("restart-loop", "fail")]
    files = report.files(results)
    assert set(files) == {"report.md", "report.json", "report.html"}
    assert json.loads(files["report.json"]) == results
    md = files["report.md"]
    assert "1 of 2 drills passed" in md
    assert "## node-exit: PASS" in md
    assert "## restart-loop: FAIL" in md
    for name in LEVELS:
        assert f"| {name} | PASS | " in md
    assert "ev-continued" in md
    assert "check FAIL: the job finished" in md
    assert "| -1.50 | checkpoint.registered ck-20 step 20 |" in md


def test_a_single_result_keeps_the_single_object_json() -> None:
    one = stored_result()
    files = report.files(one)
    assert json.loads(files["report.json"]) == one
    assert "1 of 1 drills passed" in files["report.md"]


def test_the_html_page_is_self_contained_and_plots_both_curves_with_marks() -> None:
    html = report.page([stored_result(), stored_result("restart-loop", "fail")])
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html)
    assert "<script" not in html
    assert html.count("<svg") == 2
    svg = report.loss_svg(stored_result())
    assert svg.count('class="baseline"') == 1
    assert svg.count('class="drill"') == 2  # one line per attempt
    assert svg.count('class="checkpoints"') == 2
    assert svg.count('class="faults"') == 1
    assert svg.count('class="resumes"') == 1
    # Escaped, never injected: the reasons reach the page as text.
    assert "&lt;the job finished&gt;" in html
    points = re.search(r'class="baseline"[^>]*points="([^"]+)"', svg)
    assert points is not None
    assert len(points.group(1).split()) == 30


def test_a_result_without_losses_still_renders() -> None:
    stopped = {"scenario": "node-exit", "verdict": "fail", "stopped": True,
               "reasons": ["stopped: budget exceeded"], "levels": {}, "timeline": []}  # fmt: skip
    html = report.page([stopped])
    assert "no loss recorded" in html
    assert "stopped: budget exceeded" in report.markdown([stopped])
