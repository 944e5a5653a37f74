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
* Every per-job page both ways, on one job that writes real checkpoints: a failed load pages
  `CkptHaResumeFailed` (until the fallback attempt starts) and `CkptHaCheckpointCorrupt` (its
  checkpoint quarantined; until someone releases it and it verifies again); a third restart
  within the hour pages `CkptHaRestartLoop` (the coordinator's stored plans, whichever replica
  made them); a resume whose loss differs from the trajectory pages `CkptHaResumeDiverged`;
  a hold ends both; a checkpoint quarantined automatically again pages until someone keeps it
  quarantined (the quarantine command as a person). A write left open pages
  `CkptHaCheckpointWriteStuck` until the writer-watcher declares it failed (the rules rendered
  with ``write_stuck_s=8``, as an installation would set its own).
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

from ckpt_ha import sdk
from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointQuarantinedV1,
    CheckpointState,
    CheckpointWritingV1,
    FailureSide,
)
from ckpt_ha.contracts.job import (
    FailureCauseV2,
    JobFailedV2,
    JobPolicy,
    JobProgressV1,
    JobStartedV1,
    JobStartedV2,
    Tolerance,
)
from ckpt_ha.contracts.resume import LoadBlame, ResumeLoadFailedV2, ResumePlannedV2
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.procs import ManagedProcess
from ckpt_ha.ops import alerts
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime import local_stack
from ckpt_ha.runtime.catalog import SERVICE_NAMES
from ckpt_ha.sdk.checkpoints import process_environment
from ckpt_ha.sdk.protocol import try_announce
from tests.support import observability as obs
from tests.support import prom_operator as operator
from tests.support.bus_tools import job_key, wait_for
from tests.support.k8s import K8S, Doc, render
from tests.system.e2e.test_replicas import second_replicas
from tests.system.faults.flows import job_for, stop_writer, valid_at_least
from tests.system.faults.stack import FaultStack, running_stack
from tests.system.faults.tally import job_events
from tests.system.faults.writer import CheckpointWriter

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

NAMESPACE = "ckpt-ha"
RUNBOOK = (Path(__file__).parents[3] / "docs" / "RUNBOOK.md").read_text()
ALERTS = 'ALERTS{app="ckpt-ha"}'
PAGE_S = 45.0
"""Bound on state change → alert change: the replicas read the state every 2 s
(CKPT_HA_STATE_METRICS_INTERVAL_S of the fault stack), scrape and evaluation every second."""
WRITE_STUCK_S = 8
"""`write_stuck_s` of the rules this test renders: shorter than the fault stack's writing
deadline (20 s), after which the writer-watcher declares a write that never completed failed."""


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
    rules = tmp_path / "alerts.yml"
    rules.write_text(alerts.render(alerts.shipped(), values={"write_stuck_s": WRITE_STUCK_S}))
    with running_stack(tmp_path / "home") as fs:
        extra = second_replicas(fs)
        try:
            sd_file.write_text(json.dumps(operator.targets(objects, NAMESPACE, pods_of(fs, extra))))
            with obs.prometheus_of(
                bin_dir, tmp_path / "prometheus", [scrape], None, [rules]
            ) as prom:
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
    await publish(fs, _failed(escalated, FailureCauseV2.NODE_EXIT))
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
    await _per_job_pages(fs, prom)
    await _stuck_write(fs, prom)

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


def _failed(job: str, cause: FailureCauseV2) -> JobFailedV2:
    return JobFailedV2(
        job_id=job,
        run_id="run-1",
        attempt=1,
        cause=cause,
        signature=f"{cause}:9",
        side=FailureSide.INFRASTRUCTURE,
    )


def _alert(name: str, job: str, state: str = "firing") -> str:
    return f'ALERTS{{alertname="{name}",job_id="{job}",alertstate="{state}"}}'


def _gone(name: str, job: str) -> str:
    return f'ALERTS{{alertname="{name}",job_id="{job}"}}'


async def _plans(fs: FaultStack, job: str, n: int) -> list[ResumePlannedV2]:
    """The job's first ``n`` plans, in stream order, once there are that many."""

    async def found() -> list[ResumePlannedV2]:
        events = await job_events(local_stack.bus_config(fs.state()), [job])
        plans = [e.data for e in events if isinstance(e.data, ResumePlannedV2)]
        return plans if len(plans) >= n else []

    return (await wait_for(found, timeout=PAGE_S, what=f"{n} plans of {job}"))[:n]


def _progress(
    job: str, attempt: int, step: int, plan_id: str | None = None, off: float = 0.0
) -> JobProgressV1:
    return JobProgressV1(
        job_id=job,
        run_id="run-1",
        attempt=attempt,
        step=step,
        data_position=step * 64,
        metrics={"loss": 10.0 / step + off},
        plan_id=plan_id,
    )


async def _per_job_pages(fs: FaultStack, prom: obs.Prometheus) -> None:
    """Every per-job page of the coordinator and the registrar, fired and resolved through the
    two replicas of each, on one job (see the module doc)."""
    job = job_for("opalerts-resume")
    policy = JobPolicy(tolerances=(Tolerance(metric="loss", abs=0.01),), continuity_steps=1)
    environment = process_environment(frozenset({"numpy"}), None)

    def started(attempt: int, plan_id: str | None = None) -> JobStartedV1:
        return JobStartedV1(job_id=job, run_id="run-1", attempt=attempt, plan_id=plan_id,
                            policy=policy, environment=environment)  # fmt: skip

    def failed(attempt: int) -> JobFailedV2:
        return JobFailedV2(job_id=job, run_id="run-1", attempt=attempt,
                           cause=FailureCauseV2.NODE_EXIT, signature=f"node_exit:{attempt}",
                           side=FailureSide.INFRASTRUCTURE)  # fmt: skip

    registry = Registry.from_url(fs.redis_url)
    try:
        await publish(fs, started(1))
        writer = CheckpointWriter(fs, job, every_s=0.3).start()
        try:
            await valid_at_least(registry, job, 3)
        finally:
            saves = await stop_writer(writer)
        steps = sorted(s.step for s in saves if s.committed)
        # The trajectory before the failure (a resume is compared with it), then the failure.
        await publish(fs, *(_progress(job, 1, n) for n in range(steps[0], steps[-1] + 12)))
        await publish(fs, failed(1))
        (first,) = await _plans(fs, job, 1)

        # Its load fails, blaming the checkpoint: quarantined, and the coordinator falls back.
        await publish(
            fs,
            ResumeLoadFailedV2(job_id=job, plan_id=first.plan_id, run_id="run-1",
                               checkpoint_id=first.checkpoint_id, reason="checksum mismatch",
                               blame=LoadBlame.CHECKPOINT),
        )  # fmt: skip
        prom.wait_for(_alert("CkptHaResumeFailed", job), PAGE_S)
        prom.wait_for(_alert("CkptHaCheckpointCorrupt", job), PAGE_S)
        # Both registrar replicas read the registry: the same level from each.
        level = f'ckpt_ha_checkpoints_awaiting_review{{job_id="{job}"}}'
        prom.wait_for(f"count({level} == 1) == 2", PAGE_S)
        _, fallback = await _plans(fs, job, 2)
        assert fallback.checkpoint_id != first.checkpoint_id, fallback
        # Someone looks at the bytes and releases the checkpoint: verified again, the page ends.
        released = fs.cli("checkpoints", "release", first.checkpoint_id, "--reason", "bytes ok")
        assert released.returncode == 0, released.stderr
        prom.wait_until_empty(_gone("CkptHaCheckpointCorrupt", job), PAGE_S)
        # The fallback's attempt starts: the failed load is settled.
        await publish(fs, started(fallback.attempt, fallback.plan_id))
        prom.wait_until_empty(_gone("CkptHaResumeFailed", job), PAGE_S)

        # It fails too: a third restart within the hour, planned by whichever replica.
        assert not prom.values(_gone("CkptHaRestartLoop", job))
        await publish(fs, failed(fallback.attempt))
        *_, third = await _plans(fs, job, 3)
        prom.wait_for(_alert("CkptHaRestartLoop", job), PAGE_S)
        # Both coordinator replicas export the stored count, whichever planned each restart
        # (each within a round of its own).
        restarts = f'ckpt_ha_job_recent_restarts{{job_id="{job}"}}'
        prom.wait_for(f"count({restarts} == 3) == 2", PAGE_S)
        # Its resume reports a loss far from the trajectory at the same step: diverged.
        await publish(fs, started(third.attempt, third.plan_id))
        await publish(fs, _progress(job, third.attempt, third.step + 1, third.plan_id, off=5.0))
        prom.wait_for(_alert("CkptHaResumeDiverged", job), PAGE_S)

        # Someone holds the job: both pages end.
        held = fs.cli("job", "hold", job, "--reason", "looking at the divergence")
        assert held.returncode == 0, held.stderr
        prom.wait_until_empty(_gone("CkptHaResumeDiverged", job), PAGE_S)
        prom.wait_until_empty(_gone("CkptHaRestartLoop", job), PAGE_S)
        firing = {a["metric"]["alertname"] for a in prom.values(f'ALERTS{{job_id="{job}"}}')}
        assert firing == set(), firing

        # A scrub finds the released checkpoint damaged after all: quarantined automatically,
        # paged. Someone looks and keeps it quarantined (the quarantine command again, as a
        # person): the quarantine is theirs, the page ends without a silence.
        record = await _valid_again(registry, first.checkpoint_id)
        scrubbed = CheckpointQuarantinedV1(
            job_id=job, checkpoint_id=record.checkpoint_id, uri=record.uri, reason="scrub: bad"
        )
        await publish(fs, scrubbed)
        prom.wait_for(_alert("CkptHaCheckpointCorrupt", job), PAGE_S)
        kept = fs.cli("checkpoints", "quarantine", record.checkpoint_id, "--reason", "reviewed",
                      "--actor", "alice")  # fmt: skip
        assert kept.returncode == 0, kept.stderr
        prom.wait_until_empty(_gone("CkptHaCheckpointCorrupt", job), PAGE_S)
        after = await registry.get(record.checkpoint_id)
        assert after is not None
        assert (after.state.value, after.history[-1].actor) == ("quarantined", "alice")
    finally:
        await registry.close()


async def _valid_again(registry: Registry, checkpoint_id: str) -> CheckpointRecord:
    """The released checkpoint once verified again (its bytes were never damaged)."""
    deadline = time.monotonic() + PAGE_S
    while True:
        record = await registry.get(checkpoint_id)
        if record is not None and record.state is CheckpointState.VALID:
            return record
        assert time.monotonic() < deadline, record
        await asyncio.sleep(0.5)


async def _stuck_write(fs: FaultStack, prom: obs.Prometheus) -> None:
    """A write announced and never finished: `CkptHaCheckpointWriteStuck` from the registry's
    writing record (every registrar replica), until the writer-watcher declares it failed."""
    job = job_for("opalerts-stuck")
    store = fs.writer_store()
    folder = sdk.folder_for(job, 10)
    writing = CheckpointWritingV1(job_id=job, checkpoint_id=f"stuck-{job}",
                                  uri=store.uri(folder), run_id="run-1", step=10)  # fmt: skip
    prefix = local_stack.bus_config(fs.state()).prefix
    endpoint = sdk.BusEndpoint(fs.nats_url, prefix=prefix, job_key=job_key(job), timeout_s=5.0)
    assert await asyncio.to_thread(try_announce, endpoint, writing, datetime.now(UTC))
    prom.wait_for(_alert("CkptHaCheckpointWriteStuck", job), PAGE_S)
    oldest = f'ckpt_ha_checkpoint_write_oldest_started_timestamp_seconds{{job_id="{job}"}}'
    assert len(prom.values(oldest)) == 2, prom.values(oldest)
    prom.wait_until_empty(_gone("CkptHaCheckpointWriteStuck", job), PAGE_S)
    # The round that re-drove it counted it stuck (pending CkptHaCheckpointsStuck): the next
    # round finds nothing left.
    prom.wait_until_empty('ALERTS{alertname="CkptHaCheckpointsStuck"}', PAGE_S)
