"""The inhibitions of observability/alertmanager.yml, in a real Alertmanager: an outage of NATS,
Redis or storage for an install mutes the per-job and per-consumer alerts it causes in that
install only (not in another namespace); a restart loop mutes its job's escalation; a service
down mutes its own consumers' lag. Once the outage resolves, the muted alerts are active again.

Alerts are posted as Prometheus would (``/api/v2/alerts``); the pager webhook receives the
critical ones that are not muted."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.support import observability as obs


def alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
    return {"labels": {"alertname": name, "app": "ckpt-ha", "severity": severity, **labels}}


def post(am: str, alerts: list[dict[str, Any]], *, ended: bool = False) -> None:
    now = datetime.now(UTC)
    body = [
        {
            **a,
            "startsAt": (now - timedelta(minutes=5)).isoformat(),
            "endsAt": (now if ended else now + timedelta(hours=1)).isoformat(),
        }
        for a in alerts
    ]
    request = urllib.request.Request(
        f"http://{am}/api/v2/alerts",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200


def states(am: str) -> dict[tuple[str, str, str], tuple[str, int]]:
    """(alertname, namespace, job_id or service) → (state, how many alerts mute it)."""
    with urllib.request.urlopen(f"http://{am}/api/v2/alerts", timeout=10) as resp:
        found = json.loads(resp.read())
    return {
        (
            a["labels"]["alertname"],
            a["labels"].get("namespace", ""),
            a["labels"].get("job_id") or a["labels"].get("service", ""),
        ): (a["status"]["state"], len(a["status"]["inhibitedBy"]))
        for a in found
    }


def wait_states(am: str, expected: dict[tuple[str, str, str], str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = states(am)
        if all(got.get(k, ("missing", 0))[0] == v for k, v in expected.items()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {expected}, got {got}")
        time.sleep(0.3)


def test_an_outage_mutes_the_alerts_it_causes_in_its_install_only(tmp_path: Path) -> None:
    bin_dir = obs.tools()
    redis_down = alert("CkptHaRedisUnreachable", "critical", namespace="a", service="registrar")
    sources = [
        redis_down,
        alert("CkptHaDependencyDown", "critical", namespace="b", service="registrar",
              dependency="nats"),
        alert("CkptHaRestartLoop", "critical", namespace="a", job_id="j3"),
        alert("CkptHaStorageErrorsAcrossJobs", "critical", namespace="c"),
        alert("CkptHaServiceDown", "warning", namespace="e", service="integrity-checker"),
    ]  # fmt: skip
    targets = [
        alert("CkptHaCheckpointWriteStuck", "warning", namespace="a", job_id="j1"),
        alert("CkptHaCheckpointWriteStuck", "warning", namespace="d", job_id="j2"),
        alert("CkptHaNoRecentValidCheckpoint", "warning", namespace="b", job_id="j6"),
        alert("CkptHaResumeEscalated", "critical", namespace="a", job_id="j3",
              reason="restart_loop"),
        alert("CkptHaResumeEscalated", "critical", namespace="a", job_id="j4",
              reason="no_valid_checkpoint"),
        alert("CkptHaResumeEscalated", "critical", namespace="c", job_id="j5",
              reason="storage_errors_growing"),
        alert("CkptHaConsumerLagHigh", "warning", namespace="e", service="integrity-checker",
              consumer="integrity-checker--committed"),
        alert("CkptHaConsumerLagHigh", "warning", namespace="e", service="registrar",
              consumer="registrar--checkpoints"),
    ]  # fmt: skip
    with obs.webhook() as hook, obs.alertmanager(bin_dir, tmp_path / "am", hook) as am:
        post(am, sources + targets)
        wait_states(
            am,
            {
                # Redis down in install a: a's stuck write is muted, d's is not.
                ("CkptHaCheckpointWriteStuck", "a", "j1"): "suppressed",
                ("CkptHaCheckpointWriteStuck", "d", "j2"): "active",
                # NATS down in b: b's stale recovery point is muted.
                ("CkptHaNoRecentValidCheckpoint", "b", "j6"): "suppressed",
                # A restart loop pages once: its escalation is muted, another job's is not.
                ("CkptHaResumeEscalated", "a", "j3"): "suppressed",
                ("CkptHaResumeEscalated", "a", "j4"): "active",
                # Storage failing in c: the escalation for storage errors is muted.
                ("CkptHaResumeEscalated", "c", "j5"): "suppressed",
                # A service down mutes its own consumers' lag, not another service's.
                ("CkptHaConsumerLagHigh", "e", "integrity-checker"): "suppressed",
                ("CkptHaConsumerLagHigh", "e", "registrar"): "active",
                # The outages themselves page.
                ("CkptHaRedisUnreachable", "a", "registrar"): "active",
                ("CkptHaRestartLoop", "a", "j3"): "active",
            },
        )
        # The pager hears the unmuted critical alerts, never a muted one.
        hook.wait_for("/page", lambda a: a["labels"].get("job_id") == "j4", timeout=30)
        paged = {
            (a["labels"]["alertname"], a["labels"].get("job_id", "")) for a in hook.alerts("/page")
        }
        assert ("CkptHaResumeEscalated", "j3") not in paged, paged
        assert ("CkptHaResumeEscalated", "j5") not in paged, paged

        # Redis answers again: a's stuck write is no longer muted.
        post(am, [redis_down], ended=True)
        wait_states(am, {("CkptHaCheckpointWriteStuck", "a", "j1"): "active"})
