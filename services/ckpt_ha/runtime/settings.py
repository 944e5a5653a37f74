"""Settings every service shares. Each service subclasses `ServiceSettings` once and builds it in
its entry point; nothing else reads the environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import signing

SIGNING_KEY_ENV = "CKPT_HA_SIGNING_KEY"
"""The master signing key's variables (``..._FILE``, ``..._PREVIOUS`` too): never passed on to
a training process (`ckpt_ha.contracts.signing`)."""


class MissingSigningKey(ValueError):
    def __init__(self) -> None:
        super().__init__(
            f"no job-signing key: set ${SIGNING_KEY_ENV}_FILE (or ${SIGNING_KEY_ENV}) to the "
            "deployment's master key (hex); services refuse to run without one"
        )


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
    signing_key: SecretStr | None = None
    """The master key job signatures derive from (hex); or from ``signing_key_file``."""
    signing_key_file: Path | None = None
    signing_key_previous: SecretStr | None = None
    """During a rotation: the old master key, still accepted for verification (never signs)."""
    unsigned_before_seq: int = Field(default=0, ge=0)
    """Upgrading a stream written before signing: its events below this sequence need none."""

    def signing_keys(self) -> tuple[bytes, ...]:
        """The master keys, the signing one first; raises ValueError on a malformed one."""
        texts: list[str] = []
        if self.signing_key is not None:
            texts.append(self.signing_key.get_secret_value())
        elif self.signing_key_file is not None:
            try:
                texts.append(self.signing_key_file.read_text())
            except OSError as exc:
                raise ValueError(f"cannot read the signing key file: {exc.strerror}") from None
        if self.signing_key_previous is not None:
            texts.append(self.signing_key_previous.get_secret_value())
        return tuple(signing.parse_master(t) for t in texts)

    def require_signing_keys(self) -> tuple[bytes, ...]:
        keys = self.signing_keys()
        if not keys:
            raise MissingSigningKey
        return keys

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
            signing_keys=self.signing_keys(),
            unsigned_before_seq=self.unsigned_before_seq,
        )
