"""observability/alerts.yml passes `promtool check rules`, its unit tests pass, and every alert
is covered by them both firing and staying quiet; the Alertmanager config passes amtool and its
ckpt-ha sub-route takes only ckpt-ha's alerts. Rendered with an organisation's team and runbook
address, the rules still pass promtool and carry those values."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpt_ha.ops import alerts as shipped_alerts
from ckpt_ha.runtime.catalog import SERVICE_NAMES
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
    "MetricsAbsent",
    "ConsumerInfoStale",
    "JetStreamStorageHigh",
    "RedisUnreachable",
    "StorageErrorsAcrossJobs",
}
CRITICAL = {
    "CheckpointCorrupt",
    "RestartLoop",
    "ResumeEscalated",
    "MetricsAbsent",
    "RedisUnreachable",
    "StorageErrorsAcrossJobs",
}
INFO = {"EventsParked"}
PLATFORM_WIDE = {"MetricsAbsent", "StorageErrorsAcrossJobs"}
"""Alerts about ckpt-ha as a whole: no job, service or consumer to name."""
BASE = shipped_alerts.DEFAULT_RUNBOOK_BASE
RUNBOOK = (Path(__file__).parents[2] / "docs" / "RUNBOOK.md").read_text()


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, check=False
    )


def alerts(text: str | None = None) -> list[dict[str, Any]]:
    doc = yaml.safe_load(text if text is not None else (OBSERVABILITY / "alerts.yml").read_text())
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
        labels = rule["labels"]
        severity = "critical" if name in CRITICAL else "info" if name in INFO else "warning"
        assert labels == {"severity": severity, "team": "ckpt-ha", "app": "ckpt-ha"}, name
        notes = rule["annotations"]
        # Each alert has its own section of the runbook (its heading names the severity), and
        # names step anchors that exist.
        assert notes["runbook_url"] == f"{BASE}#alert-{name.lower()}", name
        assert f'<a id="alert-{name.lower()}"></a>\n### {name} ({severity})' in RUNBOOK, name
        anchors = re.findall(r"[a-z]+(?:-[a-z]+)+", notes["runbook_step"])
        assert anchors, name
        for anchor in anchors:
            assert f'<a id="{anchor}"></a>' in RUNBOOK, (name, anchor)
        assert notes["summary"], name
        if name not in PLATFORM_WIDE:
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


def test_no_rule_depends_on_the_scrape_job_name() -> None:
    for rule in alerts():
        assert 'job="' not in rule["expr"], rule["alert"]


def test_service_down_knows_every_service() -> None:
    (rule,) = [r for r in alerts() if r["alert"] == "ServiceDown"]
    listed = re.findall(r'"service", "([a-z-]+)"', rule["expr"])
    assert sorted(listed) == sorted(SERVICE_NAMES)


def test_rendered_rules_carry_the_team_and_an_absolute_runbook_url(tmp_path: Path) -> None:
    base = "https://wiki.example.org/platform/ckpt-ha/RUNBOOK.md"
    text = shipped_alerts.render(
        (OBSERVABILITY / "alerts.yml").read_text(), team="ml-infra", runbook_base=base
    )
    (tmp_path / "alerts.yml").write_text(text)
    done = run(tools() / "promtool", "check", "rules", tmp_path / "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    rules = alerts(text)
    assert {r["alert"] for r in rules} >= REQUIRED
    for rule in rules:
        assert rule["labels"]["team"] == "ml-infra", rule["alert"]
        assert rule["annotations"]["runbook_url"] == f"{base}#alert-{rule['alert'].lower()}"


def test_render_refuses_a_relative_runbook_base_and_a_bad_team() -> None:
    text = (OBSERVABILITY / "alerts.yml").read_text()
    for bad in ("docs/RUNBOOK.md", "ftp://host/RUNBOOK.md", "https://host/RUNBOOK.md#x"):
        with pytest.raises(shipped_alerts.BadAlertSetting):
            shipped_alerts.render(text, runbook_base=bad)
    with pytest.raises(shipped_alerts.BadAlertSetting):
        shipped_alerts.render(text, team='a"b')


def _route(*labels: str) -> str:
    amtool = tools().parent / "root" / "usr" / "bin" / "amtool"
    config = OBSERVABILITY / "alertmanager.yml"
    routed = run(amtool, "config", "routes", "test", f"--config.file={config}", *labels)
    assert routed.returncode == 0, routed.stdout + routed.stderr
    return routed.stdout.strip()


def test_alertmanager_config_is_valid_and_its_sub_route_routes_by_severity() -> None:
    amtool = tools().parent / "root" / "usr" / "bin" / "amtool"
    done = run(amtool, "check-config", OBSERVABILITY / "alertmanager.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _route("app=ckpt-ha", "severity=critical", "job_id=j") == "ckpt-ha-pager"
    assert _route("app=ckpt-ha", "severity=warning", "job_id=j") == "ckpt-ha-tickets"
    assert _route("app=ckpt-ha", "severity=info") == "ckpt-ha-info"
    # Someone else's critical alert is not ckpt-ha's to page for: it stays in the root route.
    assert _route("severity=critical", "team=ckpt-ha") == "default"
    # Every alert of alerts.yml carries the label the sub-route matches.
    assert all(r["labels"]["app"] == "ckpt-ha" for r in alerts())
