"""The fault drills on S3: `ckpt-ha drill --storage s3://bucket/prefix` against a local
S3-compatible server (moto's), with the embedded stack's own nats-server and redis-server.

The drill finds the server the way any boto3 program does (``AWS_ENDPOINT_URL`` and the
credentials); it puts the stack's storage link in front of it, so that its services and the
drills' jobs reach S3 through a link the storage-outage drill cuts. One stack serves every drill
of this module.

To keep it within a few minutes it runs the drills whose fault touches storage (storage-outage,
corrupt-checkpoint) and one that escalates (env-mismatch); node-exit and restart-loop exercise
no storage path these do not, and with the framework drills (torchrun-dcp, hf-trainer) they are
left to the filesystem run (`test_drills.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.stack import STORAGE_LINK
from ckpt_ha.runtime.local_stack import StackState
from tests.support.moto_server import (
    aws_env,
    s3_client,
    start_moto_server,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

LEVELS = ("generated", "verified", "registered", "loadable", "continued")
PREFIX = "drills"


@dataclass(frozen=True)
class S3Drills:
    home: Path
    endpoint: str
    bucket: str
    client: Any

    @property
    def root(self) -> str:
        return f"s3://{self.bucket}/{PREFIX}"

    def keys(self, under: str) -> list[str]:
        """Every key of the bucket under ``PREFIX/under``, read from the server directly."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{PREFIX}/{under}"
        )
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


def cli(
    home: Path, endpoint: str | None, *args: str, timeout: float = 400
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NATS_URL", "REDIS_URL", "CKPT_HA_STORAGE_ROOT")
           and not k.startswith("AWS_")}  # fmt: skip
    env |= {"CKPT_HA_HOME": str(home), **aws_env(endpoint)}
    return subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Drills]:
    endpoint, stop_moto = start_moto_server()
    client = s3_client(endpoint)
    bucket = f"drills-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    home = tmp_path_factory.mktemp("s3-drills") / "ckpt-ha-home"
    try:
        yield S3Drills(home, endpoint, bucket, client)
    finally:
        cli(home, endpoint, "down", timeout=120)
        stop_moto()


def drill(s3: S3Drills, scenario: str) -> dict[str, Any]:
    done = cli(s3.home, s3.endpoint, "drill", "--scenario", scenario, "--storage", s3.root,
               "--json", "--budget", "300")  # fmt: skip
    assert done.stdout, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert f"storage root: {s3.root}" in done.stderr
    assert result["verdict"] == "pass", (result.get("reasons"), done.stderr[-2000:])
    assert done.returncode == 0
    # The stack's processes reach the server through its storage link, not directly.
    state = StackState.load(s3.home)
    assert state is not None
    assert state.storage_root == s3.root
    link = next(p for p in state.processes if p.name == STORAGE_LINK)
    assert procs.is_alive(link)
    assert state.storage_endpoint == f"http://127.0.0.1:{link.port}" != s3.endpoint
    assert (s3.home / f"{STORAGE_LINK}.state").read_text() == "up"  # given back after a cut
    return result


def assert_restored_from_the_bucket(s3: S3Drills, phase: dict[str, Any]) -> None:
    for name in LEVELS:
        assert phase["levels"][name]["passed"], (name, phase["reasons"])
    generated = phase["levels"]["generated"]["evidence"]["uri"]
    assert generated.startswith(f"{s3.root}/"), generated
    # The checkpoint the job was restored from is in the bucket, manifest and all.
    folder = generated.removeprefix(f"{s3.root}/")
    keys = s3.keys(folder + "/")
    assert any(k.endswith(".npy") for k in keys), keys


def test_a_bad_storage_root_or_no_s3_server_is_a_usage_error(tmp_path: Path) -> None:
    bad = cli(tmp_path, None, "drill", "--scenario", "node-exit", "--storage", "ftp://host/x")
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0
    assert "neither s3://bucket/prefix nor a local path" in bad.stderr
    nowhere = cli(tmp_path, None, "drill", "--scenario", "node-exit", "--storage", "s3://b/p")
    assert nowhere.returncode == 2
    assert nowhere.stderr.strip().count("\n") == 0
    assert "needs AWS_ENDPOINT_URL" in nowhere.stderr
    assert not (tmp_path / "stack.json").exists()  # nothing was started


def test_storage_outage_on_s3_cuts_the_link_and_the_restore_waits(s3: S3Drills) -> None:
    result = drill(s3, "storage-outage")
    assert all(result["checks"].values()), result["checks"]
    assert_restored_from_the_bucket(s3, result["phases"][1])
    interrupted = result["interrupted_write"]
    assert interrupted["committed_or_registered"] == []
    assert interrupted["state"] != "valid"
    assert any(w["side"] == "infrastructure" for w in interrupted["write_failed"])
    assert result["restore_wait"]["loaded"]
    assert result["restore_wait"]["quarantined"] == []


def test_corrupt_object_on_s3_is_caught_at_load_and_quarantined(s3: S3Drills) -> None:
    result = drill(s3, "corrupt-checkpoint")
    assert all(result["checks"].values()), result["checks"]
    assert_restored_from_the_bucket(s3, result)
    assert result["damaged_state"] == "quarantined"
    assert result["restored_from"] != result["damaged_checkpoint"]
    # The damaged object was moved into the bucket's quarantine/.
    quarantined = s3.keys(f"quarantine/{result['job']}/")
    assert any(k.endswith(".npy") for k in quarantined), quarantined


def test_env_mismatch_on_s3_escalates(s3: S3Drills) -> None:
    result = drill(s3, "env-mismatch")
    assert all(result["checks"].values()), result["checks"]
    assert result["escalation"]["reason"] == "compatibility_unknown"
    assert result["job_exit_code"] == 6  # escalated (the exit-code table; 3 is unreachable)
    assert s3.keys(f"{result['job']}/"), "the job's checkpoints are in the bucket"
