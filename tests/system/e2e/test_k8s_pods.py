"""The pods of deploy/k8s/ run as the manifests say, short of a cluster: each container's
arguments, its ConfigMap and its env, its Secrets laid out as mounted files, against a real
nats-server with the generated permissions and a real Redis with the generated ACL users (the
committed redis.conf), both requiring passwords and TLS, verified against the CA the pods mount.
The provisioning CronJob's command creates the streams as ``operator``, twice (it is idempotent);
then each of the five services starts under its own user and passes /livez and /readyz.

What the cluster would supply differently is swapped for local values: the URLs of the private
servers, a local storage root instead of S3, the loopback address and a free port for HTTP.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from pydantic import SecretStr

from ckpt_ha.bus import permissions
from ckpt_ha.lab.devstack import procs
from ckpt_ha.registry import acl
from tests.support.k8s import K8S, Doc, MissingSecret, lay_out_pod, pod_spec, render
from tests.support.tls import TlsFiles, make_tls, start_tls_redis, tls_redis_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CLI = [sys.executable, "-m", "ckpt_ha.cli.main"]
"""The image's ENTRYPOINT, ``ckpt-ha``."""


def status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return make_tls(tmp_path / "tls")


@pytest.fixture
def cluster_secrets(tls: TlsFiles) -> dict[str, dict[str, str]]:
    """The Secrets docs/DEPLOY.md says to create, with fresh values."""
    return {
        **{
            f"ckpt-ha-nats-{u}": {"password": secrets.token_urlsafe(24)}
            for u in permissions.users()
        },
        **{f"ckpt-ha-redis-{u}": {"password": secrets.token_urlsafe(24)} for u in acl.users()},
        "ckpt-ha-signing-key": {"key": secrets.token_hex(32)},
        "ckpt-ha-ca": {"ca.crt": tls.ca.read_text()},
    }


def _passwords(
    cluster: dict[str, dict[str, str]], server: str, users: Iterable[str]
) -> dict[str, str]:
    """Each principal's password, from its own Secret ``ckpt-ha-<server>-<principal>``."""
    return {u: cluster[f"ckpt-ha-{server}-{u}"]["password"] for u in users}


def _servers(
    tmp_path: Path, passwords: dict[str, dict[str, str]], tls: TlsFiles
) -> tuple[procs.ManagedProcess, procs.ManagedProcess]:
    """NATS and Redis as deploy/ configures them: TLS only, a password for every user."""
    nats_env = {
        permissions.env_password(user).removeprefix("$"): json.dumps(pw)
        for user, pw in _passwords(passwords, "nats", permissions.users()).items()
    }
    tls_block = f'tls {{\n  cert_file: "{tls.cert}"\n  key_file: "{tls.key}"\n}}\n'
    nats = procs.start_nats(
        tmp_path / "nats",
        config_extra=tls_block + permissions.render(),
        env=nats_env,
        scheme="tls",
    )
    try:
        redis_pw = _passwords(passwords, "redis", acl.users())
        text = acl.render(
            lambda u: SecretStr(redis_pw[u]),
            read_only_keys=procs.redis_server_version(tls_redis_server()) >= (7, 0),
        )
        redis = start_tls_redis(tmp_path, tls, text, ("operator", redis_pw["operator"]))
    except BaseException:
        procs.stop(nats)
        raise
    return nats, redis


def ready_at(port: int) -> Callable[[], bool]:
    return lambda: status(port, "/readyz") == 200


def test_the_job_provisions_and_every_service_becomes_ready(
    tmp_path: Path, cluster_secrets: dict[str, dict[str, str]], tls: TlsFiles
) -> None:
    docs = render(K8S / "overlays" / "example")
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    nats, redis = _servers(tmp_path, cluster_secrets, tls)
    started: list[procs.ManagedProcess] = []
    storage = tmp_path / "storage"
    storage.mkdir()

    def local_env(doc: Doc, http_port: int) -> dict[str, str]:
        env = lay_out_pod(doc, configmaps, cluster_secrets, tmp_path / doc["metadata"]["name"])
        env.pop("AWS_ENDPOINT_URL", None)
        # The servers are verified against the CA as the pod mounts it from its Secret.
        assert Path(env["CKPT_HA_NATS_CA_FILE"]).read_text() == tls.ca.read_text()
        assert Path(env["CKPT_HA_REDIS_CA_FILE"]).read_text() == tls.ca.read_text()
        return {
            **env,
            "NATS_URL": nats.url,
            "REDIS_URL": redis.url,
            "CKPT_HA_STREAM_REPLICAS": "1",
            "CKPT_HA_STORAGE_ROOT": str(storage),
            "CKPT_HA_HTTP_HOST": "127.0.0.1",
            "CKPT_HA_HTTP_PORT": str(http_port),
        }

    try:
        # The provisioning CronJob's command, twice: a second run (the next schedule, or a run
        # after an upgrade) converges on the same streams and succeeds.
        (job,) = [d for d in docs if d["kind"] == "CronJob"]
        args = pod_spec(job)["containers"][0]["args"]
        for _ in range(2):
            done = subprocess.run(
                [*CLI, *args],
                env={**os.environ, **local_env(job, 0)},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            assert "CKPT_EVENTS" in done.stdout
            assert "CKPT_DLQ" in done.stdout

        for doc in [d for d in docs if d["kind"] == "Deployment"]:
            name = doc["metadata"]["name"]
            port = procs.free_port()
            argv = [*CLI, *pod_spec(doc)["containers"][0]["args"]]
            started.append(
                procs.start_process(
                    name,
                    argv,
                    home=tmp_path,
                    env=local_env(doc, port),
                    http_port=port,
                    marker=" ".join(argv[-2:]),
                    ready=ready_at(port),
                    timeout=90,
                )
            )
            assert status(port, "/livez") == 200, name
        assert len(started) == 5
    finally:
        for proc in reversed(started):
            procs.stop(proc, timeout=15)
        procs.stop(redis)
        procs.stop(nats)


def test_a_pod_without_its_secret_would_not_start(tmp_path: Path) -> None:
    docs = render(K8S / "overlays" / "example")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    with pytest.raises(MissingSecret, match="ckpt-ha-nats"):
        lay_out_pod(deployment, {"ckpt-ha-config": {}}, {}, tmp_path)
