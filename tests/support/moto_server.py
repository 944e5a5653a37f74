"""A real S3-compatible HTTP server (moto) on a free loopback port, for integration tests."""

from __future__ import annotations

from collections.abc import Callable

from moto.server import ThreadedMotoServer

# moto accepts any credentials; tests pass these explicitly instead of touching the environment.
FAKE_ACCESS_KEY = "testing"
FAKE_SECRET_KEY = "testing"


def start_moto_server() -> tuple[str, Callable[[], None]]:
    """Start moto in a background thread and return (endpoint_url, stop).

    Port 0 lets the kernel pick a free port atomically (no probe-then-bind race); `start` only
    returns once the socket is listening.
    """
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return f"http://{host}:{port}", server.stop
