"""Evidence every drill records besides its own checks: the drill job's loss curve, the job's
metrics after the drill, and the alerts the stack's Prometheus fired. (The fixed baseline and
its reference curve come from the drill's workload, `ckpt_ha.lab.drill.workloads`.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ckpt_ha.runtime import local_stack


def drill_losses(runner_log: Path | None) -> list[list[float]]:
    """(step, loss, attempt) of every step the drill's job printed, in order."""
    out: list[list[float]] = []
    if runner_log is None or not runner_log.exists():
        return out
    for line in runner_log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
            out.append([int(doc["step"]), float.fromhex(doc["loss"]), int(doc["attempt"])])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def metrics_after(state: local_stack.StackState, job: str) -> dict[str, float]:
    """The job's series on every service's /metrics once the drill ended (what a dashboard or an
    alert sees), plus each service's dead-letter total. Unreachable services are skipped."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for proc in state.processes:
        if not proc.http_port:
            continue
        try:
            with urlopen(f"http://127.0.0.1:{proc.http_port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if labels.get("job_id") == job:
                    extra = ",".join(
                        f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("job_id",)
                    )
                    out[f"{sample.name}{{{extra}}}"] = sample.value
                elif sample.name == "ckpt_ha_dead_letters_total":
                    key = f"{sample.name}{{service={labels.get('service', proc.name)}}}"
                    out[key] = out.get(key, 0.0) + sample.value
    return dict(sorted(out.items()))


def alerts_fired(state: local_stack.StackState, job: str, expected: str | None) -> dict[str, Any]:
    """Which of the shipped alerts fired (or are pending) for the job, as the stack's Prometheus
    evaluated them. Waits a few evaluation rounds (longer for an alert the scenario expects)."""
    import urllib.parse
    from urllib.request import urlopen

    prom = next((p for p in state.processes if p.name == "prometheus"), None)
    if prom is None:
        return {
            "available": False,
            "alerts": {},
            "why": "this stack runs no Prometheus (run scripts/observability-tools, then "
            "`ckpt-ha down` / `up`)",
        }
    query = (
        f'max by (alertname, alertstate, severity) (max_over_time(ALERTS{{job_id="{job}"}}[1h]))'
    )
    url = f"{prom.url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    deadline = time.monotonic() + (30.0 if expected else 6.0)
    alerts: dict[str, dict[str, str]] = {}
    while True:
        try:
            with urlopen(url, timeout=5) as resp:  # noqa: S310 - the stack's own Prometheus
                doc = json.loads(resp.read())
        except OSError as exc:
            return {"available": False, "alerts": {}, "why": f"Prometheus unreachable: {exc}"}
        for item in doc.get("data", {}).get("result", []):
            m = item["metric"]
            name = m.get("alertname", "?")
            if alerts.get(name, {}).get("state") != "firing":  # firing wins over pending
                alerts[name] = {
                    "state": m.get("alertstate", "?"),
                    "severity": m.get("severity", "?"),
                }
        done = expected is None or alerts.get(expected, {}).get("state") == "firing"
        if done or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    return {"available": True, "alerts": alerts, "prometheus": prom.url}
