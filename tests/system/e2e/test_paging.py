"""Paging end to end: the embedded stack (`ckpt-ha up`), a real Prometheus scraping its five
services' /metrics with observability/alerts.yml, and a real Alertmanager with
observability/alertmanager.yml, whose ckpt-ha sub-route sends ``severity=critical`` to a webhook
receiver run here.

A checkpoint damaged on the stack's storage (the corrupt-checkpoint drill) and a restart loop
(the restart-loop drill) must each page on-call, naming the job (and the checkpoint's step).
Then every Grafana panel's PromQL runs against this Prometheus.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.ops.alerts import DEFAULT_RUNBOOK_BASE
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime import local_stack
from ckpt_ha.runtime.catalog import SERVICE_NAMES
from ckpt_ha.runtime.local_stack import StackState
from tests.support import observability as obs
from tests.support.dashboards import dashboard_queries, variable_queries

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PAGE_WITHIN_S = 60.0
"""Bound on fault → page: scrape 1s, evaluation 1s, Alertmanager group_wait 1s, plus slack."""


def cli(home: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REDIS_URL")}
    env["CKPT_HA_HOME"] = str(home)
    env["CKPT_HA_CONSUMER_INFO_INTERVAL_S"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass(frozen=True)
class Setup:
    home: Path
    state: StackState
    prometheus: obs.Prometheus
    hook: obs.Webhook


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    bin_dir = obs.tools()
    work = tmp_path_factory.mktemp("paging")
    home = work / "ckpt-ha-home"
    try:
        started = cli(home, "up", timeout=180)
        assert started.returncode == 0, started.stderr[-3000:]
        state = StackState.load(home)
        assert state is not None
        targets = [f"127.0.0.1:{p.http_port}" for p in state.processes if p.name in SERVICE_NAMES]
        assert len(targets) == 5, state.processes
        with (
            obs.webhook() as hook,
            obs.alertmanager(bin_dir, work / "alertmanager", hook) as am,
            obs.prometheus(bin_dir, work / "prometheus", targets, am) as prom,
        ):
            up = prom.wait_for('sum(up{job="ckpt-ha"}) == 5', timeout=30)
            assert up
            yield Setup(home, state, prom, hook)
    finally:
        cli(home, "down", timeout=120)


def drill(home: Path, scenario: str) -> dict[str, Any]:
    done = cli(home, "drill", "--scenario", scenario, "--json", "--budget", "300")
    assert done.stdout, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["verdict"] == "pass", (result.get("reasons"), done.stderr[-2000:])
    return result


async def step_of(state: StackState, checkpoint_id: str) -> int | None:
    registry = Registry.from_url(local_stack.redis_config(state))
    try:
        record = await registry.get(checkpoint_id)
    finally:
        await registry.close()
    assert record is not None
    return record.step


def test_a_corrupt_checkpoint_pages_with_its_job_and_step(setup: Setup) -> None:
    result = drill(setup.home, "corrupt-checkpoint")
    job, damaged = result["job"], result["damaged_checkpoint"]
    step = asyncio.run(step_of(setup.state, damaged))

    page = setup.hook.wait_for(
        "/page",
        lambda a: (
            a["labels"].get("alertname") == "CkptHaCheckpointCorrupt"
            and a["labels"].get("job_id") == job
        ),
        PAGE_WITHIN_S,
    )
    assert page["status"] == "firing"
    assert page["labels"]["severity"] == "critical"
    assert page["labels"]["app"] == "ckpt-ha"
    assert f"step {step}" in page["annotations"]["summary"]
    assert job in page["annotations"]["description"]
    assert (
        page["annotations"]["runbook_url"]
        == f"{DEFAULT_RUNBOOK_BASE}#alert-ckpthacheckpointcorrupt"
    )
    # The metrics behind it, without any checkpoint id in a label.
    corrupt = setup.prometheus.wait_for(
        'sum by (reason) (ckpt_ha_checkpoint_corrupt_total{reason="load_failed"})', 10
    )
    assert float(corrupt[0]["value"][1]) >= 1
    failed = setup.prometheus.wait_for(
        f'ckpt_ha_resume_last_outcome_timestamp_seconds{{job_id="{job}",outcome="load_failed"}}',
        10,
    )
    assert failed
    # failure → plan → loaded → verified, each timed
    stages = setup.prometheus.wait_for(
        "sum by (stage) (ckpt_ha_resume_duration_seconds_count) > 0", 10
    )
    assert {s["metric"]["stage"] for s in stages} >= {"planned", "loaded", "verified"}


def test_a_restart_loop_pages_with_its_job(setup: Setup) -> None:
    result = drill(setup.home, "restart-loop")
    job = result["job"]

    page = setup.hook.wait_for(
        "/page",
        lambda a: (
            a["labels"].get("alertname") == "CkptHaRestartLoop" and a["labels"].get("job_id") == job
        ),
        PAGE_WITHIN_S,
    )
    assert page["status"] == "firing"
    assert job in page["annotations"]["summary"]
    # No page for a job that only restarted within its limits (the corrupt drill's job).
    loops = {a["labels"]["job_id"] for a in setup.hook.alerts("/page")
             if a["labels"]["alertname"] == "CkptHaRestartLoop"}  # fmt: skip
    assert loops == {job}
    # Its checkpoints are fine: no corruption page for it.
    corrupt = [a for a in setup.hook.alerts("/page")
               if a["labels"]["alertname"] == "CkptHaCheckpointCorrupt"]  # fmt: skip
    assert corrupt
    assert job not in {a["labels"]["job_id"] for a in corrupt}
    # The platform-wide alerts stay quiet on a healthy stack, not even pending.
    quiet = (
        "CkptHaMetricsAbsent|CkptHaServiceDown|CkptHaConsumerInfoStale|CkptHaRedisUnreachable"
        "|CkptHaDependencyDown"
    )
    noisy = setup.prometheus.query(f'ALERTS{{alertname=~"{quiet}|CkptHaJetStreamStorageHigh"}}')
    assert noisy["status"] == "success"
    assert noisy["data"]["result"] == []


def test_every_dashboard_query_runs_and_key_panels_have_data(setup: Setup) -> None:
    prom = setup.prometheus
    jobs = prom.wait_for("ckpt_ha_last_valid_checkpoint_timestamp_seconds", 10)
    job = jobs[0]["metric"]["job_id"]
    queries = dashboard_queries()
    assert queries
    empty_key_panels = []
    for q in queries:
        answer = prom.query(q.promql(job=job))
        assert answer["status"] == "success", (q.dashboard, q.panel, q.expr, answer)
        if q.key and not answer["data"]["result"]:
            empty_key_panels.append((q.dashboard, q.panel, q.expr))
    assert not empty_key_panels
    # The drill-down's job variable lists every job the drills started, whether or not it has
    # a valid checkpoint.
    started = {s["metric"]["job_id"] for s in prom.wait_for("ckpt_ha_job_restarts_total", 10)}
    for var in variable_queries():
        answer = prom.query(var.promql())
        assert answer["status"] == "success", (var, answer)
        if var.name != "job":  # cluster, namespace: none on the local stack ("All")
            assert answer["data"]["result"], var
            continue
        listed = {s["metric"][var.label] for s in answer["data"]["result"]}
        assert listed >= started | {s["metric"]["job_id"] for s in jobs}, var
