"""The alerts as deployed: the scrape configuration the Prometheus Operator generates from the
shipped ServiceMonitor (deploy/k8s/base/servicemonitor.yaml, rendered by
`tests.support.prom_operator` with its relabelling of ``service``, ``namespace``, ``pod``,
``endpoint`` and ``job``) and the shipped rules, in a real Prometheus scraping two replicas of
each of the five services (the fault stack and a second replica of each, as pods of the
shipped Deployments).

* Everything up: no ckpt-ha alert is pending or firing, and every series carries the service's
  own name as ``service`` (the pods' ``app.kubernetes.io/name``).
* Pages built on stored state, across replicas: an escalated job pages until it is held; a
  lost job pages until a new attempt starts. Whichever replica handled each event, both
  replicas export the same series.
* Both replicas of the registrar gone: ``CkptHaServiceDown`` fires for ``registrar`` alone, and the
  runbook's ``kubectl get pods`` command, filled in from its labels, selects the registrar's
  pods and no other.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import EventData, build
from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.job import FailureCause, JobFailedV2, JobStartedV1, JobStartedV2
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.procs import ManagedProcess
from ckpt_ha.runtime import local_stack
from ckpt_ha.runtime.catalog import SERVICE_NAMES
from tests.support import observability as obs
from tests.support import prom_operator as operator
from tests.support.k8s import K8S, Doc, render
from tests.system.e2e.test_replicas import second_replicas
from tests.system.faults.flows import job_for
from tests.system.faults.stack import FaultStack, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NAMESPACE = "ckpt-ha"
RUNBOOK = (Path(__file__).parents[3] / "docs" / "RUNBOOK.md").read_text()
ALERTS = 'ALERTS{app="ckpt-ha"}'
PAGE_S = 45.0
"""Bound on state change → alert change: the replicas read the state every 2 s
(CKPT_HA_STATE_METRICS_INTERVAL_S of the fault stack), scrape and evaluation every second."""


async def publish(fs: FaultStack, *events: EventData) -> None:
    bus = Bus(local_stack.bus_config(fs.state()), "operator-alerts-runner")
    await bus.broker.start()
    try:
        for data in events:
            key = f"{type(data).__name__}-{time.monotonic_ns()}"
            await bus.publish(build(data, source="ckpt-ha/runner", time=datetime.now(UTC), key=key))
    finally:
        await bus.broker.stop()


def pods_of(fs: FaultStack, extra: list[ManagedProcess]) -> list[operator.Pod]:
    pods = []
    for name in SERVICE_NAMES:
        for replica, proc in (("a", fs.service(name)), ("b", _second(extra, name))):
            pods.append(
                operator.Pod(
                    name=f"ckpt-ha-{name}-{replica}",
                    deployment=f"ckpt-ha-{name}",
                    address=f"127.0.0.1:{proc.http_port}",
                )
            )
    return pods


def _second(extra: list[ManagedProcess], name: str) -> ManagedProcess:
    return next(p for p in extra if p.marker == f"serve {name}")


def firing(prom: obs.Prometheus, alert: str, **labels: str) -> list[dict[str, str]]:
    selector = ",".join([f'alertname="{alert}"', *(f'{k}="{v}"' for k, v in labels.items())])
    return [r["metric"] for r in prom.values(f"ALERTS{{{selector}}}")]


def test_alerts_as_deployed_by_the_operator_over_two_replicas(tmp_path: Path) -> None:
    objects = render(K8S / "base")
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    sd_file = tmp_path / "targets.json"
    scrape = operator.scrape_config(monitor, 0, NAMESPACE, sd_file, interval="1s")
    bin_dir = obs.tools()
    with running_stack(tmp_path / "home") as fs:
        extra = second_replicas(fs)
        try:
            sd_file.write_text(json.dumps(operator.targets(objects, NAMESPACE, pods_of(fs, extra))))
            with obs.prometheus_of(bin_dir, tmp_path / "prometheus", [scrape]) as prom:
                asyncio.run(_scenario(fs, extra, prom, objects))
        finally:
            for proc in extra:
                procs.stop(proc, timeout=15)


async def _scenario(
    fs: FaultStack, extra: list[ManagedProcess], prom: obs.Prometheus, objects: list[Doc]
) -> None:
    started = time.monotonic()
    # Ten targets up, each labelled as the Operator labels them, `service` the service's name.
    up = prom.wait_for(f'count(up{{namespace="{NAMESPACE}"}} == 1) == 10', timeout=60)
    assert up
    series = prom.values(f'ckpt_ha_service_up{{namespace="{NAMESPACE}"}}')
    assert sorted(s["metric"]["service"] for s in series) == sorted(SERVICE_NAMES * 2)
    for s in series:
        labels = s["metric"]
        assert "exported_service" not in labels, labels
        assert labels["pod"].startswith(f"ckpt-ha-{labels['service']}-"), labels
        assert labels["job"] == f"ckpt-ha-{labels['service']}", labels
        assert labels["endpoint"] == "http", labels
    # Everything up, nothing happening: no ckpt-ha alert pending or firing (a rule evaluated
    # for a few seconds over all ten targets).
    await asyncio.sleep(5)
    assert prom.values(ALERTS) == [], prom.values(ALERTS)

    # An escalation pages, on both replicas' series, until someone holds the job.
    escalated = job_for("opalerts-escalated")
    await publish(fs, JobStartedV1(job_id=escalated, run_id="run-1", attempt=1))
    await publish(fs, _failed(escalated, FailureCause.NODE_EXIT))
    found = prom.wait_for(
        f'ALERTS{{alertname="CkptHaResumeEscalated",job_id="{escalated}",alertstate="firing"}}',
        PAGE_S,
    )
    assert found[0]["metric"]["reason"] == "no_valid_checkpoint", found
    assert found[0]["metric"]["namespace"] == NAMESPACE, found
    # Each replica reads the stored state on its own clock: both export it within a round.
    attention = f'ckpt_ha_job_attention_since_timestamp_seconds{{job_id="{escalated}"}}'
    prom.wait_for(f"count({attention}) == 2", PAGE_S)
    per_replica = prom.values(attention)
    assert sorted(s["metric"]["pod"] for s in per_replica) == [
        "ckpt-ha-restore-coordinator-a",
        "ckpt-ha-restore-coordinator-b",
    ], per_replica
    assert len({s["value"][1] for s in per_replica}) == 1, per_replica
    held = fs.cli("job", "hold", escalated, "--reason", "looking at it")
    assert held.returncode == 0, held.stderr
    prom.wait_until_empty(
        f'ALERTS{{alertname="CkptHaResumeEscalated",job_id="{escalated}"}}', PAGE_S
    )

    # A lost attempt (held first, so its failure stays undecided) pages until a new start.
    lost = job_for("opalerts-lost")
    held = fs.cli("job", "hold", lost, "--reason", "no restores for this test")
    assert held.returncode == 0, held.stderr
    await publish(fs, JobStartedV2(job_id=lost, run_id="run-1", heartbeat_s=1, deadline_s=2))
    prom.wait_for(
        f'ALERTS{{alertname="CkptHaJobLost",job_id="{lost}",alertstate="firing"}}', PAGE_S
    )
    await publish(fs, JobStartedV2(job_id=lost, run_id="run-2", heartbeat_s=30, deadline_s=600))
    prom.wait_until_empty(f'ALERTS{{alertname="CkptHaJobLost",job_id="{lost}"}}', PAGE_S)
    assert [a for a in prom.values(ALERTS) if a["metric"]["alertname"] != "CkptHaJobLost"] == []

    # Both registrar replicas gone: CkptHaServiceDown for the registrar alone (pending: its `for`
    # is 2 minutes; the rule's own result is what fires then).
    for proc in (fs.service("registrar"), _second(extra, "registrar")):
        procs.stop(proc, timeout=15)
    down = prom.wait_for('ALERTS{alertname="CkptHaServiceDown"}', timeout=PAGE_S)
    assert [d["metric"]["service"] for d in down] == ["registrar"], down
    labels = down[0]["metric"]
    assert labels["namespace"] == NAMESPACE, labels
    await asyncio.sleep(3)
    assert {a["metric"]["alertname"] for a in prom.values(ALERTS)} <= {"CkptHaServiceDown"}
    # The runbook's command, filled in from the alert, selects exactly the registrar's pods.
    command = re.search(r"`(kubectl get pods [^`]*SERVICE[^`]*)`", RUNBOOK)
    assert command is not None
    filled = (
        command.group(1)
        .replace("SERVICE", labels["service"])
        .replace("NAMESPACE", labels["namespace"])
    )
    selector = re.search(r"-l (\S+)", filled)
    assert selector is not None, filled
    assert f"-n {NAMESPACE}" in filled, filled
    chosen = [
        d["metadata"]["name"]
        for d in objects
        if d["kind"] == "Deployment"
        and operator.selects(selector.group(1), d["spec"]["template"]["metadata"]["labels"])
    ]
    assert chosen == ["ckpt-ha-registrar"], (filled, chosen)
    print(f"OPERATOR_ALERTS duration_s={time.monotonic() - started:.1f}")


def _failed(job: str, cause: FailureCause) -> JobFailedV2:
    return JobFailedV2(
        job_id=job,
        run_id="run-1",
        attempt=1,
        cause=cause,
        signature=f"{cause}:9",
        side=FailureSide.INFRASTRUCTURE,
    )
