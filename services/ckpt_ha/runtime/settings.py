"""Settings every service shares. Each service subclasses `ServiceSettings` once and builds it in
its entry point; nothing else reads the environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from ckpt_ha.bus.config import BusConfig


class ServiceSettings(BaseSettings):
    """Environment variables are ``CKPT_HA_<FIELD>``; NATS_URL and REDIS_URL are also read plain."""

    model_config = SettingsConfigDict(
        env_prefix="CKPT_HA_", extra="ignore", frozen=True, populate_by_name=True
    )

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        validation_alias="NATS_URL",
    )
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", validation_alias="REDIS_URL")
    subject_prefix: str = Field(default="ckpt", pattern=r"^[A-Za-z0-9_-]+$")
    events_stream: str = Field(default="CKPT_EVENTS", pattern=r"^[A-Za-z0-9_-]+$")
    dead_letter_stream: str = Field(default="CKPT_DLQ", pattern=r"^[A-Za-z0-9_-]+$")
    registry_prefix: str = Field(default="ckpt-ha", pattern=r"^[A-Za-z0-9_:.-]+$")
    storage_root: str = Field(default=str(Path.home() / ".ckpt-ha" / "storage"))
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=0, ge=0, le=65535)
    """0 picks a free port; the chosen port is written to the log and the status file."""
    ack_wait_s: float = Field(default=30.0, gt=0)
    max_deliver: int = Field(default=5, ge=2, le=100)
    backoff_s: tuple[float, ...] = (1.0, 5.0, 15.0, 30.0)
    fetch_batch: int = Field(default=64, ge=1, le=1024)
    graceful_timeout_s: float = Field(default=20.0, gt=0)
    consumer_info_interval_s: float = Field(default=10.0, gt=0)
    """How often each durable consumer's pending/ack-pending counts are read for /metrics."""
    metrics_forget_after_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """A job idle this long leaves the per-job metric series (bounds their cardinality)."""

    def bus(self) -> BusConfig:
        return BusConfig(
            url=self.nats_url,
            user=self.nats_user,
            password=self.nats_password.get_secret_value() if self.nats_password else None,
            prefix=self.subject_prefix,
            events_stream=self.events_stream,
            dead_letter_stream=self.dead_letter_stream,
            ack_wait_s=self.ack_wait_s,
            max_deliver=self.max_deliver,
            backoff_s=self.backoff_s,
            fetch_batch=self.fetch_batch,
            graceful_timeout_s=self.graceful_timeout_s,
        )
