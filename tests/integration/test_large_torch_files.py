"""No size skips a safety check: a torch file over the 1 GiB load limit still has its pickle
read by the restricted unpickler, cheaply (its ``data.pkl`` only, never the tensor bytes).

Before, a ``pytorch_model.bin`` over 1 GiB skipped the safe-load check: one whose pickle calls
``exec`` verified VALID, alone and inside a Hugging Face Trainer folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_ha.formats import limits, verify, verify_path
from ckpt_ha.formats.report import Verdict
from ckpt_ha.storage import FsStore
from tests.support.torch_tools import ExecPayload, require_torch, write_large_torch_file

REPO = Path(__file__).resolve().parents[2]
SIZE = limits.MAX_LOAD_BYTES + 64 * 1024 * 1024


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Sparse files past the load limit: a hostile and a benign bare ``pytorch_model.bin``,
    and a Trainer folder whose weights are the hostile one."""
    torch = require_torch()
    root = tmp_path_factory.mktemp("large")
    marker = root / "marker"
    hostile = root / "hostile" / "pytorch_model.bin"
    benign = root / "benign" / "pytorch_model.bin"
    for path in (hostile, benign):
        path.parent.mkdir()
    write_large_torch_file(hostile, {"w": torch.ones(2), "x": ExecPayload(marker)}, SIZE)
    write_large_torch_file(benign, torch.nn.Linear(4, 2).state_dict(), SIZE)
    trainer = root / "job-1" / "checkpoint-10"
    trainer.mkdir(parents=True)
    os.link(hostile, trainer / "pytorch_model.bin")
    (trainer / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (trainer / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    return {"hostile": hostile, "benign": benign, "trainer": trainer, "marker": marker}


def test_a_hostile_file_past_the_load_limit_is_unsafe(files: dict[str, Path]) -> None:
    assert files["hostile"].stat().st_size > limits.MAX_LOAD_BYTES
    report = verify_path(files["hostile"])
    assert report.verdict is Verdict.UNSAFE, report.reasons
    assert "global __builtin__.exec" in report.reasons[0]
    assert not files["marker"].exists()


def test_a_trainer_folder_with_it_is_unsafe_in_the_service_path(files: dict[str, Path]) -> None:
    """What the integrity-checker runs: `formats.verify` on the folder through its store."""
    trainer = files["trainer"]
    report = verify(FsStore(trainer.parent.parent), "job-1/checkpoint-10")
    assert report.verdict is Verdict.UNSAFE, report.reasons
    assert any(
        "pytorch_model.bin: refused by the restricted unpickler" in r for r in report.reasons
    )


def test_a_benign_file_past_the_load_limit_stays_valid(files: dict[str, Path]) -> None:
    report = verify_path(files["benign"])
    assert report.verdict is Verdict.VALID, report.reasons
    assert "torch-pickle:restricted" in report.checks
    assert any(c.startswith("torch-load:not-run for 1 file(s) over") for c in report.checks)


@pytest.mark.parametrize("which", ["hostile", "trainer"])
def test_ckpt_ha_verify_says_unsafe(files: dict[str, Path], which: str, tmp_path: Path) -> None:
    env = {**os.environ, "CKPT_HA_HOME": str(tmp_path / "home")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "services"), str(REPO / "contracts")])
    result = subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", "verify", str(files[which])],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout.startswith("UNSAFE  "), result.stdout
    assert "Traceback" not in result.stderr
    assert not files["marker"].exists()
