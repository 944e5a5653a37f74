"""The same format checks through S3 (moto's server mode), and `ckpt-ha verify` as a process."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from mypy_boto3_s3 import S3Client
from safetensors.numpy import save_file

from ckpt_ha.formats import native, verify
from ckpt_ha.formats.report import Verdict
from ckpt_ha.storage import FsStore, S3Store
from tests.support.moto_server import (
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    s3_client,
    start_moto_server,
)
from tests.support.torch_tools import (
    Payload,
    require_torch,
    torch_saved,
    write_dcp,
    write_hf_torch_files,
)

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def moto_bucket() -> Iterator[tuple[str, str, S3Client]]:
    """(endpoint, bucket, client) of a moto server started for this module."""
    endpoint, stop = start_moto_server()
    client = s3_client(endpoint)
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    yield endpoint, bucket, client
    stop()


@pytest.fixture(scope="module")
def s3_store(moto_bucket: tuple[str, str, S3Client]) -> S3Store:
    _, bucket, client = moto_bucket
    return S3Store(bucket, prefix="runs", client=client)


def test_native_and_safetensors_on_s3(s3_store: S3Store, tmp_path: Path) -> None:
    shards = {"rank-0.bin": os.urandom(6 * 1024 * 1024), "rank-1.bin": b"tail"}
    native.write(s3_store, "job-a/step-5", shards, step=5, created_at=NOW)
    report = verify(s3_store, "job-a/step-5")
    assert report.verdict is Verdict.VALID, report.reasons
    assert report.step == 5
    assert report.bytes_read == sum(len(v) for v in shards.values())

    s3_store.put("job-a/step-5/rank-1.bin", b"TAIL")  # same size, different bytes
    report = verify(s3_store, "job-a/step-5")
    assert report.verdict is Verdict.CORRUPT
    assert any("rank-1.bin: checksum" in r for r in report.reasons)

    local = tmp_path / "model.safetensors"
    save_file({"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, str(local))
    s3_store.put("job-b/final/model.safetensors", local.read_bytes())
    assert verify(s3_store, "job-b/final").verdict is Verdict.VALID


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_verify_cli_exit_codes_and_json(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    native.write(FsStore(good), "", {"a.bin": b"x" * 100}, step=42, created_at=NOW)
    out = cli("verify", str(good), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["verdict"], doc["format"], doc["step"]) == ("valid", "native", 42)
    assert doc["reasons"] == []

    (good / "a.bin").write_bytes(b"y" * 100)
    out = cli("verify", str(good))
    assert out.returncode == 1
    assert out.stdout.startswith("CORRUPT")
    assert "a.bin: checksum" in out.stdout

    out = cli("verify", str(tmp_path / "nope"))
    assert out.returncode == 2
    assert out.stderr.strip().endswith("no such file or directory")
    assert len(out.stderr.strip().splitlines()) == 1

    out = cli("verify", str(good), "--checksum", "md5")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1


def test_latest_valid_by_recorded_step_with_reasons(tmp_path: Path) -> None:
    root = tmp_path / "run"
    root.mkdir()
    store = FsStore(root)
    for name, step in (("ckpt-a", 300), ("ckpt-b", 200), ("ckpt-z", 100)):
        native.write(store, name, {"w.bin": bytes([step % 256]) * 64}, step=step, created_at=NOW)
    store.put("ckpt-a/w.bin", b"\x00" * 64)  # newest step is corrupt
    store.put("ckpt-c/w.bin", b"half-written")  # no manifest: never valid
    out = cli("latest-valid", str(root), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["path"] == str(root / "ckpt-b")  # by recorded step, not by name ("ckpt-z")
    assert doc["step"] == 200
    assert [(r["path"].rsplit("/", 1)[1], r["verdict"]) for r in doc["rejected"]] == [
        ("ckpt-a", "corrupt"),
    ]
    text = cli("latest-valid", str(root))
    assert "LATEST VALID" in text.stdout
    assert "rejected" in text.stdout

    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("latest-valid", str(empty)).returncode == 1
    assert cli("latest-valid", str(tmp_path / "missing")).returncode == 2


def _upload(store: S3Store, folder: Path, prefix: str) -> None:
    for path in sorted(folder.iterdir()):
        store.put(f"{prefix}/{path.name}", path.read_bytes())


def test_dcp_on_s3_reads_metadata_and_ranges(s3_store: S3Store, tmp_path: Path) -> None:
    local = write_dcp(tmp_path / "step-9", step=None)
    _upload(s3_store, local, "job-d/step-9")
    report = verify(s3_store, "job-d/step-9")
    assert report.verdict is Verdict.VALID, report.reasons
    assert (report.step, report.checks[-1]) == (9, "step:folder-name")
    assert "dcp-bytes:weights_only" in report.checks
    assert report.checksums == verify(FsStore(local), "").checksums

    s3_store.delete("job-d/step-9/__0_0.distcp")
    assert verify(s3_store, "job-d/step-9").verdict is Verdict.INCOMPLETE


def test_verify_cli_on_dcp_valid_and_hostile(tmp_path: Path) -> None:
    folder = write_dcp(tmp_path / "step-100")
    out = cli("verify", str(folder), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["verdict"], doc["format"], doc["step"]) == ("valid", "torch_dcp", 7)
    assert "__0_0.distcp" in doc["checksums"]

    marker = tmp_path / "marker"
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    out = cli("verify", str(folder), "--json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["verdict"], doc["format"]) == ("unsafe", "torch_dcp")
    assert any("refusing to unpickle" in r for r in doc["reasons"])
    assert not marker.exists()
    out = cli("verify", str(folder))
    assert (out.returncode, out.stdout.split()[0]) == (1, "UNSAFE")


def test_verify_cli_on_hostile_trainer_optimizer(tmp_path: Path) -> None:
    torch = require_torch()
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "trainer_state.json").write_text('{"global_step": 3}')
    torch.save(torch.nn.Linear(2, 2).state_dict(), folder / "pytorch_model.bin")
    write_hf_torch_files(folder)
    out = cli("verify", str(folder), "--json")
    assert out.returncode == 0, out.stderr
    assert "torch-load:weights_only" in json.loads(out.stdout)["checks"]

    marker = tmp_path / "marker"
    (folder / "optimizer.pt").write_bytes(torch_saved({"state": {}, "x": Payload(marker)}))
    out = cli("verify", str(folder), "--json")
    assert out.returncode == 1
    assert json.loads(out.stdout)["verdict"] == "unsafe"
    assert not marker.exists()


def test_verify_and_latest_valid_cli_on_s3(
    moto_bucket: tuple[str, str, S3Client], tmp_path: Path
) -> None:
    endpoint, bucket, client = moto_bucket
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    run = S3Store(bucket, prefix="cli-run", client=client)
    for name, step in (("ckpt-a", 300), ("ckpt-b", 200), ("ckpt-z", 100)):
        native.write(run, name, {"w.bin": bytes([step % 256]) * 64}, step=step, created_at=NOW)
    run.put("ckpt-a/w.bin", b"\x00" * 64)  # newest step is corrupt
    local = tmp_path / "model.safetensors"
    save_file({"w": np.arange(6, dtype=np.float32)}, str(local))
    S3Store(bucket, prefix="loose", client=client).put("model.safetensors", local.read_bytes())
    root = f"s3://{bucket}/cli-run"

    out = cli("verify", f"{root}/ckpt-b", "--json", env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["verdict"], doc["format"], doc["step"]) == ("valid", "native", 200)
    out = cli("verify", f"{root}/ckpt-a/", env=env)
    assert out.returncode == 1, out.stderr
    assert out.stdout.startswith(f"CORRUPT  {root}/ckpt-a/")
    assert "w.bin: checksum" in out.stdout
    out = cli("verify", f"s3://{bucket}/loose/model.safetensors", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["format"] == "safetensors"

    out = cli("latest-valid", root, "--json", env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["path"], doc["step"]) == (f"{root}/ckpt-b", 200)
    assert [(r["path"], r["verdict"]) for r in doc["rejected"]] == [(f"{root}/ckpt-a", "corrupt")]

    # Nothing under the prefix is a usage error (2); a bucket that cannot be read, or an S3
    # that does not answer, is an unreachable dependency (3).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    down = {**env, "AWS_ENDPOINT_URL": closed, "AWS_MAX_ATTEMPTS": "1"}
    for command in ("verify", "latest-valid"):
        for where, code, extra in (
            (f"{root}/nope", 2, env),
            (f"s3://missing-{uuid.uuid4().hex[:8]}/x", 3, env),
            (root, 3, down),
        ):
            out = cli(command, where, env=extra)
            assert out.returncode == code, (command, where, out.stdout, out.stderr)
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr
            assert where in out.stderr


def test_a_read_budget_holds_verification_on_s3_to_pieces_it_paid_for(s3_store: S3Store) -> None:
    """The scrub's budget on an S3 root: every byte verification reads is charged, in pieces
    no larger than `PIECE`, each waited for before it is read (time is a fake the sleep moves)."""
    from ckpt_ha.storage.read_budget import PIECE, BudgetedStore, ReadBudget

    shards = {"rank-0.bin": os.urandom(3 * 1024 * 1024 + 7), "rank-1.bin": b"tail"}
    native.write(s3_store, "budgeted/step-1", shards, step=1, created_at=NOW)
    now = [0.0]
    pieces: list[int] = []

    class Recording(ReadBudget):
        def take(self, n: int) -> None:
            pieces.append(n)
            super().take(n)

    def sleep(seconds: float) -> None:
        now[0] += seconds

    rate, burst = 1024 * 1024, 512 * 1024
    budget = Recording(rate, burst, clock=lambda: now[0], sleep=sleep)
    report = verify(BudgetedStore(s3_store, budget), "budgeted/step-1")
    assert report.ok, report
    on_s3 = sum(info.size for info in s3_store.list("budgeted/step-1/"))
    assert budget.bytes_read >= on_s3
    assert 0 < max(pieces) <= PIECE
    assert now[0] == pytest.approx((budget.bytes_read - burst) / rate)
