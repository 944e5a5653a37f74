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
    "CkptHaCheckpointCorrupt",
    "CkptHaRestartLoop",
    "CkptHaNoRecentValidCheckpoint",
    "CkptHaCheckpointWriteStuck",
    "CkptHaResumeDiverged",
    "CkptHaResumeFailed",
    "CkptHaResumeEscalated",
    "CkptHaJobLost",
    "CkptHaDeadLetterGrowing",
    "CkptHaConsumerLagHigh",
    "CkptHaServiceDown",
    "CkptHaDependencyDown",
    "CkptHaMetricsAbsent",
    "CkptHaConsumerInfoStale",
    "CkptHaJetStreamStorageHigh",
    "CkptHaRedisUnreachable",
    "CkptHaStorageErrorsAcrossJobs",
    "CkptHaLoopWithoutLeader",
    "CkptHaPeriodicRoundStale",
    "CkptHaResumePlanningBudgetFastBurn",
    "CkptHaResumePlanningBudgetSlowBurn",
    "CkptHaVerificationBudgetFastBurn",
    "CkptHaVerificationBudgetSlowBurn",
}
CRITICAL = {
    "CkptHaCheckpointCorrupt",
    "CkptHaRestartLoop",
    "CkptHaResumeEscalated",
    "CkptHaMetricsAbsent",
    "CkptHaRedisUnreachable",
    "CkptHaStorageErrorsAcrossJobs",
    "CkptHaDependencyDown",
    "CkptHaResumePlanningBudgetFastBurn",
    "CkptHaVerificationBudgetFastBurn",
}
INFO = {"CkptHaEventsParked"}
PLATFORM_WIDE = {
    "CkptHaMetricsAbsent",
    "CkptHaStorageErrorsAcrossJobs",
    "CkptHaResumePlanningBudgetFastBurn",
    "CkptHaResumePlanningBudgetSlowBurn",
    "CkptHaVerificationBudgetFastBurn",
    "CkptHaVerificationBudgetSlowBurn",
}
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
        # One prefix, so that a shared Alertmanager tells ckpt-ha's alerts apart; the dashboard
        # to open, the job's (with the job selected) for an alert about one job.
        assert name.startswith("CkptHa"), name
        about_a_job = "$labels.job_id" in notes["summary"] + notes["description"]
        dashboard = (
            "ckpt-ha-job?var-job={{ $labels.job_id }}" if about_a_job else "ckpt-ha-overview"
        )
        assert notes["dashboard_url"] == f"{shipped_alerts.DEFAULT_DASHBOARD_BASE}/{dashboard}"


def test_every_aggregation_keeps_cluster_and_namespace() -> None:
    """Two installs in one Prometheus stay apart: every ``by (...)`` keeps both labels (only
    `absent`, which has no labels to keep, is exempt)."""
    doc = yaml.safe_load((OBSERVABILITY / "alerts.yml").read_text())
    for rule in (r for g in doc["groups"] for r in g["rules"]):
        groupings = re.findall(r"\bby \(([^)]*)\)", rule["expr"])
        name = rule.get("alert") or rule["record"]
        raw = re.search(r"(?<![\w:])ckpt_ha_", rule["expr"])
        assert groupings or "absent(" in rule["expr"] or not raw, name
        for grouping in groupings:
            labels = {x.strip() for x in grouping.split(",")}
            assert {"cluster", "namespace"} <= labels, (name, grouping)
        for joined in re.findall(r"\bon \(([^)]*)\)", rule["expr"]):
            assert {"cluster", "namespace"} <= {x.strip() for x in joined.split(",")}, name


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
    (rule,) = [r for r in alerts() if r["alert"] == "CkptHaServiceDown"]
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
            shipped_alerts.render(text, dashboard_base=bad)
    with pytest.raises(shipped_alerts.BadAlertSetting):
        shipped_alerts.render(text, team='a"b')
    for selector in ("namespace=ml", 'namespace="ml"}', 'a="b" or vector(1)'):
        with pytest.raises(shipped_alerts.BadAlertSetting):
            shipped_alerts.render(text, selector=selector)
    with pytest.raises(shipped_alerts.BadAlertSetting):
        shipped_alerts.render(text, values={"no_such_threshold": 1})


def test_rendered_rules_read_only_the_selected_series_with_the_given_thresholds(
    tmp_path: Path,
) -> None:
    """A mixin's knobs without jsonnet: every series the rules read carries the selector, a
    marked threshold takes the given value, and promtool still accepts the result."""
    text = (OBSERVABILITY / "alerts.yml").read_text()
    assert shipped_alerts.thresholds(text)["consumer_lag_messages"] == 1000
    selector = 'namespace="ml-platform",cluster=~"eu-.*"'
    rendered = shipped_alerts.render(
        text,
        selector=selector,
        values={"consumer_lag_messages": 5000, "write_stuck_s": 2700},
        dashboard_base="https://grafana.example.org/grafana/d/",
    )
    (tmp_path / "alerts.yml").write_text(rendered)
    done = run(tools() / "promtool", "check", "rules", tmp_path / "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = yaml.safe_load(rendered)
    exprs = [r["expr"] for g in doc["groups"] for r in g["rules"]]
    reads = [m for e in exprs for m in re.finditer(r"(?<![\w:])ckpt_ha_[a-z0-9_]+(.)", e)]
    assert len(reads) > 40
    for read in reads:
        assert read.group(0).endswith("{"), read.group(0)
    assert all(f"{{{selector}" in m.string[m.start() :] for m in reads)
    by_name = {r["alert"]: r for r in alerts(rendered)}
    assert "> 5000  # threshold: consumer_lag_messages" in by_name["CkptHaConsumerLagHigh"]["expr"]
    assert "> 2700  # threshold: write_stuck_s" in by_name["CkptHaCheckpointWriteStuck"]["expr"]
    assert by_name["CkptHaServiceDown"]["annotations"]["dashboard_url"] == (
        "https://grafana.example.org/grafana/d/ckpt-ha-overview"
    )


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
