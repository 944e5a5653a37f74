"""observability/alerts.yml passes `promtool check rules`, its unit tests pass, and every alert
is covered by them both firing and staying quiet; the Alertmanager config passes amtool."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.observability import OBSERVABILITY, tools

REQUIRED = {
    "CheckpointCorrupt",
    "RestartLoop",
    "NoRecentValidCheckpoint",
    "CheckpointWriteStuck",
    "ResumeDiverged",
    "ResumeFailed",
    "ResumeEscalated",
    "JobLost",
    "DeadLetterGrowing",
    "ConsumerLagHigh",
    "ServiceDown",
    "DependencyDown",
}
PAGES = {"CheckpointCorrupt", "RestartLoop", "ResumeEscalated"}
RUNBOOK = (Path(__file__).parents[2] / "docs" / "RUNBOOK.md").read_text()


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, check=False
    )


def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load((OBSERVABILITY / "alerts.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules() -> None:
    done = run(tools() / "promtool", "check", "rules", OBSERVABILITY / "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_rule_unit_tests_pass() -> None:
    done = run(tools() / "promtool", "test", "rules", OBSERVABILITY / "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    rules = {r["alert"]: r for r in alerts()}
    assert set(rules) >= REQUIRED
    for name, rule in rules.items():
        severity = rule["labels"]["severity"]
        assert severity == ("page" if name in PAGES else "ticket"), name
        notes = rule["annotations"]
        # Each alert has its own section of the runbook, and names step anchors that exist.
        assert notes["runbook_url"] == f"docs/RUNBOOK.md#alert-{name.lower()}", name
        assert f'<a id="alert-{name.lower()}"></a>' in RUNBOOK, name
        anchors = re.findall(r"[a-z]+(?:-[a-z]+)+", notes["runbook_step"])
        assert anchors, name
        for anchor in anchors:
            assert f'<a id="{anchor}"></a>' in RUNBOOK, (name, anchor)
        assert notes["summary"], name
        assert "$labels" in notes["summary"] + notes["description"], name


def test_every_alert_is_tested_firing_and_quiet() -> None:
    doc = yaml.safe_load((OBSERVABILITY / "alerts_test.yml").read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in doc["tests"]:
        for case in test["alert_rule_test"]:
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    names = {r["alert"] for r in alerts()}
    assert firing >= names
    assert quiet >= names


def test_alertmanager_config_is_valid_and_routes_pages() -> None:
    amtool = tools().parent / "root" / "usr" / "bin" / "amtool"
    done = run(amtool, "check-config", OBSERVABILITY / "alertmanager.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    config = OBSERVABILITY / "alertmanager.yml"
    routed = run(
        amtool, "config", "routes", "test", f"--config.file={config}", "severity=page", "job_id=j"
    )
    assert routed.stdout.strip() == "pager", routed.stdout + routed.stderr
