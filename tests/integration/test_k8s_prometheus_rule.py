"""The PrometheusRule of deploy/k8s/ holds rules promtool accepts and whose unit tests
(observability/alerts_test.yml) pass when run against the rule's own spec, not the source file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from ckpt_ha.cli import alerts as alerts_cli
from tests.support.k8s import K8S, load
from tests.support.observability import OBSERVABILITY, tools


def _promtool(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tools() / "promtool"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def _rule_files(tmp_path: Path, spec: object) -> Path:
    (tmp_path / "rule.yml").write_text(yaml.safe_dump(spec))
    tests = yaml.safe_load((OBSERVABILITY / "alerts_test.yml").read_text())
    tests["rule_files"] = ["rule.yml"]
    (tmp_path / "rule_test.yml").write_text(yaml.safe_dump(tests))
    return tmp_path


def test_promtool_checks_and_tests_the_prometheus_rule(tmp_path: Path) -> None:
    (rule,) = load(K8S / "base" / "prometheusrule.yaml")
    folder = _rule_files(tmp_path, rule["spec"])
    checked = _promtool("check", "rules", "rule.yml", cwd=folder)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", "rule_test.yml", cwd=folder)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    (rule,) = load(K8S / "base" / "prometheusrule.yaml")
    rule["spec"]["groups"][0]["rules"][-1]["expr"] = "sum(("
    checked = _promtool("check", "rules", "rule.yml", cwd=_rule_files(tmp_path, rule["spec"]))
    assert checked.returncode != 0


def test_a_rendered_prometheus_rule_carries_the_team_and_passes_promtool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = "https://wiki.example.org/ckpt-ha/RUNBOOK.md"
    argv = ["--team", "ml-infra", "--runbook-base", base, "--prometheus-rule"]
    assert alerts_cli.main(argv) == 0
    (rule,) = list(yaml.safe_load_all(capsys.readouterr().out))
    assert rule["kind"] == "PrometheusRule"
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    assert {r["labels"]["team"] for r in alerts} == {"ml-infra"}
    assert all(r["annotations"]["runbook_url"].startswith(f"{base}#alert-") for r in alerts)
    (tmp_path / "rule.yml").write_text(yaml.safe_dump(rule["spec"]))
    checked = _promtool("check", "rules", "rule.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_renderer_refuses_a_relative_runbook_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert alerts_cli.main(["--runbook-base", "docs/RUNBOOK.md"]) == 2
    assert "absolute" in capsys.readouterr().err
