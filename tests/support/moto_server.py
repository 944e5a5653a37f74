"""A real S3-compatible HTTP server (moto) on a free loopback port, for integration tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config
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


def s3_client(endpoint: str, config: Config | None = None) -> Any:
    """A boto3 S3 client on ``endpoint`` with the fake credentials (``config``: retries and
    timeouts, botocore's defaults when None)."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=FAKE_ACCESS_KEY,
        aws_secret_access_key=FAKE_SECRET_KEY,
        config=config,
    )


def aws_env(endpoint: str | None) -> dict[str, str]:
    """What any boto3 program reads (the services and the SDK take no S3 settings of their own):
    the fake credentials, no config files, and the endpoint unless None."""
    env = {
        "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    if endpoint is not None:
        env["AWS_ENDPOINT_URL"] = endpoint
    return env
