"""The drill report renders from a stored result alone (pure): Markdown, the JSON `--json`
prints, a self-contained HTML page whose inline SVG plots baseline against drill losses, and a
JUnit XML file with one test case per scenario. Evidence reads as named fields, never JSON; a
level a scenario does not reach by design reads "not expected", never FAIL."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Any

from ckpt_ha.lab.drill import report, run

LEVELS = ("generated", "verified", "registered", "loadable", "continued")


def stored_result(scenario: str = "node-exit", verdict: str = "pass") -> dict[str, Any]:
    losses = [[s, 1.0 / s] for s in range(1, 31)]
    drill = [[s, 1.0 / s, 1] for s in range(1, 24)] + [[s, 1.0 / s, 2] for s in range(21, 31)]
    levels: dict[str, Any] = {
        n: {"passed": True, "evidence": {"event_id": f"ev-{n}"}} for n in LEVELS
    }
    levels["verified"]["evidence"] |= {
        "checks": ["manifest", "sizes"],
        "checksums": ["a.npy=sha256:ab12"],
        "bytes_verified": 4096,
    }
    levels["continued"]["evidence"] |= {
        "step": 24,
        "comparisons": [
            {"name": "loss", "expected": 0.25, "observed": 0.25, "tolerance": 0.0, "ok": True}
        ],
    }
    return {
        "scenario": scenario,
        "verdict": verdict,
        "job": f"drill-{scenario}-x",
        "levels": levels,
        "expected_levels": list(LEVELS),
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
    assert set(files) == {"report.md", "report.json", "report.html", "junit.xml"}
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


def escalated_result() -> dict[str, Any]:
    """A drill that passes by escalating: the restore stops after the load, by design."""
    levels = {n: {"passed": n != "continued", "evidence": {"event_id": f"ev-{n}"}}
              for n in LEVELS}  # fmt: skip
    levels["continued"]["evidence"] = {}
    return {**stored_result("restart-loop"), "levels": levels, "expected_levels": [],
            "escalation": {"event_id": "ev-esc", "reason": "restart_loop",
                           "next_step": "look at the job's log"},
            "checks": {"escalated": True},
            "metrics_after": {"ckpt_ha_job_restarts_total{}": 2.0,
                              "ckpt_ha_resume_last_outcome_timestamp_seconds{outcome=escalated,"
                              "reason=restart_loop}": 1796140800.0},
            "alerts_fired": {"available": True, "alerts": {
                "CkptHaRestartLoop": {"state": "firing", "severity": "critical"}}}}  # fmt: skip


def not_run_result() -> dict[str, Any]:
    return {"scenario": "hf-trainer", "verdict": "not_run", "job": None, "fault": "kill",
            "reasons": ["not run: its training job needs torch"], "levels": {},
            "timeline": []}  # fmt: skip


class Cells(HTMLParser):
    """The text of every ``td.evidence`` and of every level's result cell."""

    def __init__(self) -> None:
        super().__init__()
        self.evidence: list[str] = []
        self.results: list[str] = []
        self._into: list[str] | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        cls = dict(attrs).get("class") or ""
        if self._into is not None:
            self._depth += tag == "td"
            return
        if tag == "td" and cls == "evidence":
            self._into, self._depth = self.evidence, 1
            self.evidence.append("")
        elif tag == "td" and cls in ("pass", "fail", "na"):
            self._into, self._depth = self.results, 1
            self.results.append("")

    def handle_endtag(self, tag: str) -> None:
        if self._into is not None and tag == "td":
            self._depth -= 1
            if self._depth == 0:
                self._into = None

    def handle_data(self, data: str) -> None:
        if self._into is not None:
            self._into[-1] += data


def test_evidence_reads_as_named_fields_not_json() -> None:
    results = [stored_result(), escalated_result()]
    page = report.page(results)
    cells = Cells()
    cells.feed(page)
    assert len(cells.evidence) >= 10  # five levels of each drill, and the escalation
    for text in cells.evidence:
        assert not re.search(r"[{}\[\]]|\"\w+\":", text), text
    assert "<th>event</th><td>ev-generated</td>" in page
    assert "<th>bytes verified</th><td>4096</td>" in page
    assert "<th>checks</th><td>manifest, sizes</td>" in page
    assert "loss: observed 0.25, expected 0.25: ok" in page
    # What the report has no own place for (here: the escalation) is listed as fields too.
    assert "<th>next step</th><td>look at the job&#x27;s log</td>" in page
    # A series after the drill keeps its metric name, its labels without braces; a timestamp
    # reads as a time.
    assert "<th>ckpt_ha_job_restarts_total</th><td>2</td>" in page
    assert ("<th>ckpt_ha_resume_last_outcome_timestamp_seconds (outcome=escalated, "
            "reason=restart_loop)</th><td>2026-12-01T16:00:00+00:00</td>") in page  # fmt: skip
    assert (
        '<th>CkptHaRestartLoop</th><td><table class="fields"><tr><th>state</th><td>firing' in page
    )
    assert "ckpt_ha_job_restarts_total: 2;" in report.markdown(results)
    assert '<th>baseline config</th><td><table class="fields"><tr><th>seed</th>' in page
    md = report.markdown(results)
    assert "| verified | PASS | event: ev-verified; checks: manifest, sizes; checksums: " in md
    assert "comparisons: loss: observed 0.25, expected 0.25: ok |" in md
    assert "- baseline config: seed: 0" in md
    assert "- escalation: event: ev-esc; reason: restart_loop; next step: look at" in md
    levels_md = [line for line in md.splitlines() if line.startswith("| ") and " | " in line]
    assert not any("{" in line for line in levels_md)


def test_a_level_not_reached_by_design_reads_not_expected_not_fail() -> None:
    passed, escalated = stored_result(), escalated_result()
    md = report.markdown([escalated])
    assert "| continued | not expected | none |" in md
    assert "| loadable | PASS | event: ev-loadable |" in md
    assert "| continued | FAIL" not in md
    cells = Cells()
    cells.feed(report.page([escalated]))
    assert cells.results.count("not expected") == 1
    assert "FAIL" not in cells.results
    assert "not expected" in run.as_text(escalated)
    assert "FAIL" not in run.as_text(escalated)
    # An expected level that did not pass is still a FAIL, and all five are expected by
    # default (a result recorded before expected_levels existed).
    broken = {**passed, "levels": {**passed["levels"], "loadable": {"passed": False,
                                                                   "evidence": {}}}}  # fmt: skip
    assert "| loadable | FAIL | none |" in report.markdown([broken])
    del broken["expected_levels"]
    assert "| loadable | FAIL | none |" in report.markdown([broken])
    # A phase declares its own: the write phase of a storage outage has no restore of its own.
    write = {**passed, "scenario": "x/write", "expected_levels": [],
             "levels": {n: {"passed": False, "evidence": {}} for n in LEVELS}}  # fmt: skip
    phased = {**passed, "phases": [write, {**broken, "scenario": "x/restore"}]}
    md = report.markdown([phased])
    assert md.count("| not expected |") == 5
    assert md.count("| FAIL |") == 1


def test_the_junit_file_has_one_testcase_per_scenario_with_the_reasons_of_failures() -> None:
    results = [stored_result(), stored_result("corrupt-checkpoint", "fail"), escalated_result(),
               not_run_result()]  # fmt: skip
    doc = ET.fromstring(report.files(results)["junit.xml"])
    assert doc.tag == "testsuites"
    (suite,) = doc.findall("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["node-exit", "corrupt-checkpoint", "restart-loop",
                                              "hf-trainer"]  # fmt: skip
    assert {c.get("classname") for c in cases} == {"ckpt-ha.drill"}
    assert cases[0].get("time") == "12.50"
    ok, bad, escalated, skipped = cases
    assert ok.find("failure") is None
    assert ok.find("skipped") is None
    failure = bad.find("failure")
    assert failure is not None
    assert failure.get("message") == "not met: <the job finished>"
    assert failure.text == "not met: <the job finished>"
    assert escalated.find("failure") is None
    out = escalated.findtext("system-out") or ""
    assert re.search(r"not expected +continued", out)
    assert re.search(r"PASS +loadable +event: ev-loadable", out)
    assert skipped.find("failure") is None
    skip = skipped.find("skipped")
    assert skip is not None
    assert "needs torch" in (skip.get("message") or "")
    props = {p.get("name"): p.get("value") for p in ok.iter("property")}
    assert props["job"] == "drill-node-exit-x"
    assert props["restored_from"] == "ck-20"
