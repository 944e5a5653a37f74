"""Evidence every drill records besides its own checks: the fixed baseline (model, data,
config, environment, resources), the loss curves of the reference run and of the drill's job,
the job's metrics after the drill, and the alerts the stack's Prometheus fired."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckpt_ha.devstack import stack
from ckpt_ha.drill.harness import EXAMPLE


def baseline(job_args: Sequence[str]) -> dict[str, Any]:
    """What every drill keeps fixed: model, data, config, environment and resources."""
    import numpy as np

    from ckpt_ha.examples import numpy_mlp

    cfg, _ = numpy_mlp.parse(list(job_args))
    return {
        "model": f"{EXAMPLE}: MLP {numpy_mlp.FEATURES}-{numpy_mlp.HIDDEN}-1 (tanh, dropout "
        f"{cfg.dropout}), Adam, warm-up then cosine LR",
        "data": f"synthetic regression set, {numpy_mlp.SAMPLES} x {numpy_mlp.FEATURES}, "
        f"dataset seed {numpy_mlp.DATASET_SEED}, batch {cfg.batch_size}",
        "config": dataclasses.asdict(cfg),
        "job_args": list(job_args),
        "environment": {"python": platform.python_version(), "numpy": np.__version__,
                        "platform": platform.platform()},
        "resources": {"cpus": os.cpu_count(), "processes": 1, "gpus": 0},
    }  # fmt: skip


def baseline_losses(job_args: Sequence[str]) -> list[list[float]]:
    """The uninterrupted run of the same job with the same seed, in-process: (step, loss)."""
    from ckpt_ha import sdk
    from ckpt_ha.examples import numpy_mlp

    cfg, _ = numpy_mlp.parse(list(job_args))
    # Checkpoints, sleeps and crashes change no loss: the reference run does without them.
    cfg = dataclasses.replace(
        cfg, checkpoint_every=cfg.steps + 1, sleep_per_step=0.0, slow_save=0.0,
        crash_at_step=None, crash_after_resume=False,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as root, contextlib.redirect_stdout(io.StringIO()):
        losses = numpy_mlp.train(cfg, sdk.Context("baseline", "baseline", 1, root, None))
    return [[step, loss] for step, loss in losses]


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


def metrics_after(state: stack.StackState, job: str) -> dict[str, float]:
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


def alerts_fired(state: stack.StackState, job: str, expected: str | None) -> dict[str, Any]:
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
