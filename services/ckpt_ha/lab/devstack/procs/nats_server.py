"""A private JetStream-enabled nats-server."""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from pathlib import Path

from ckpt_ha.lab.devstack.procs.binaries import nats_server_binary
from ckpt_ha.lab.devstack.procs.ports import (
    LOCALHOST,
    PROBE_TIMEOUT,
    accepts_tcp,
    free_port,
    retry_port_race,
)
from ckpt_ha.lab.devstack.procs.spawn import DEFAULT_START_TIMEOUT, start_process, write_private
from ckpt_ha.runtime.local_stack import ManagedProcess


def _nats_config(
    home: Path, *, port: int, http_port: int, server_name: str, max_payload: int, extra: str
) -> str:
    store_dir = home / "nats" / "js"
    # json.dumps quotes strings the way the NATS config parser accepts them.
    return "\n".join(
        [
            f"server_name: {json.dumps(server_name)}",
            f"listen: {LOCALHOST}:{port}",
            f"http: {LOCALHOST}:{http_port}",
            f"max_payload: {max_payload}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store_dir))}",
            # fsync every write: a checkpoint event acked by JetStream must survive a power cut.
            "  sync_interval: always",
            "}",
            extra,
            "",
        ]
    )


def _nats_healthy(port: int, http_port: int) -> bool:
    if not accepts_tcp(port):
        return False
    conn = http.client.HTTPConnection(LOCALHOST, http_port, timeout=PROBE_TIMEOUT)
    try:
        conn.request("GET", "/healthz?js-enabled-only=true")
        return conn.getresponse().status == http.client.OK
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def start_nats(
    home: Path,
    *,
    port: int | None = None,
    http_port: int | None = None,
    config_extra: str = "",
    server_name: str = "ckpt-ha",
    max_payload: int = 8 * 1024 * 1024,
    timeout: float = DEFAULT_START_TIMEOUT,
    env: Mapping[str, str] | None = None,
    scheme: str = "nats",
) -> ManagedProcess:
    """A JetStream-enabled nats-server whose state lives under ``home/nats``.

    See `_start_nats_once`; ports left to us are picked again if another process takes one
    between our pick and the server's bind. ``env`` is laid over the server's environment (the
    config reads ``$VARIABLES`` from it: passwords); ``scheme`` is the URL's (``tls`` for a
    config with a ``tls {}`` block).
    """
    return retry_port_race(
        lambda: _start_nats_once(
            home,
            port=port,
            http_port=http_port,
            config_extra=config_extra,
            server_name=server_name,
            max_payload=max_payload,
            timeout=timeout,
            env=env,
            scheme=scheme,
        ),
        ports_chosen_here=port is None or http_port is None,
    )


def _start_nats_once(
    home: Path,
    *,
    port: int | None = None,
    http_port: int | None = None,
    config_extra: str = "",
    server_name: str = "ckpt-ha",
    max_payload: int = 8 * 1024 * 1024,
    timeout: float = DEFAULT_START_TIMEOUT,
    env: Mapping[str, str] | None = None,
    scheme: str = "nats",
) -> ManagedProcess:
    """A JetStream-enabled nats-server whose state lives under ``home/nats``.

    The config is (re)written to ``home/nats/nats.conf`` on every start; JetStream data in
    ``home/nats/js`` is kept, so starting again with the same ``home`` recovers streams and
    messages. Ready means the client port accepts connections and
    ``/healthz?js-enabled-only=true`` answers 200 on the monitoring port.
    """
    binary = nats_server_binary()
    port = port if port is not None else free_port()
    http_port = http_port if http_port is not None else free_port()
    nats_dir = home / "nats"
    (nats_dir / "js").mkdir(parents=True, exist_ok=True)
    config_path = nats_dir / "nats.conf"
    write_private(
        config_path,
        _nats_config(
            home,
            port=port,
            http_port=http_port,
            server_name=server_name,
            max_payload=max_payload,
            extra=config_extra,
        ),
    )
    return start_process(
        "nats",
        [str(binary), "-c", str(config_path)],
        home=home,
        env=env,
        port=port,
        url=f"{scheme}://{LOCALHOST}:{port}",
        http_port=http_port,
        marker=binary.name,
        ready=lambda: _nats_healthy(port, http_port),
        lock=nats_dir / "server.lock",
        timeout=timeout,
    )
