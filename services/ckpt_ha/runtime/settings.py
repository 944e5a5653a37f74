"""Settings every service shares. Each service subclasses `ServiceSettings` once and builds it in
its entry point; nothing else reads the environment.

Every secret is a ``SecretStr`` field, read from ``CKPT_HA_<FIELD>`` or from the file named by
``CKPT_HA_<FIELD>_FILE`` (`credentials.read_secret`, for every such field of every subclass)."""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ckpt_ha import credentials
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import signing
from ckpt_ha.registry.client import RedisConfig


def is_secret(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


class SecretSources(PydanticBaseSettingsSource):
    """Each ``SecretStr`` field from ``<prefix><FIELD>`` or ``<prefix><FIELD>_FILE``."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        name = (str(self.config.get("env_prefix") or "") + field_name).upper()
        return credentials.read_secret(os.environ, name), name, False

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for field_name, field in self.settings_cls.model_fields.items():
            if is_secret(field.annotation):
                value, _, _ = self.get_field_value(field, field_name)
                if value is not None:
                    found[field_name] = value
        return found


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
    """Environment variables are ``CKPT_HA_<FIELD>``; NATS_URL and REDIS_URL are also read plain.

    Each field's docstring is its description in the README's settings table
    (`ckpt_ha.cli.settings_table` generates it; a test fails when the two differ)."""

    model_config = SettingsConfigDict(
        env_prefix="CKPT_HA_",
        extra="ignore",
        frozen=True,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        validation_alias="NATS_URL",
    )
    """The broker; a ``tls://`` URL for TLS; a cluster's servers separated by commas (the local
    stack starts its own when unset)."""
    nats_user: str | None = None
    """This process's NATS user (deploy/nats/; credentials and their rotation:
    docs/SECURITY.md); None: no login."""
    nats_password: SecretStr | None = None
    """That user's password."""
    nats_ca_file: str | None = None
    """CA bundle for a ``tls://`` NATS_URL (else the system's trust store)."""
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", validation_alias="REDIS_URL")
    """The registry; ``rediss://`` for TLS; ``redis+sentinel://[user:pass@]h1:p1,h2:p2/service[/db]``
    (``rediss+sentinel://`` with TLS) follows the master through Sentinel (the local stack
    starts its own when unset)."""
    redis_user: str | None = None
    """This process's Redis ACL user (deploy/redis/users.acl); None: the default user."""
    redis_password: SecretStr | None = None
    """That user's password."""
    redis_ca_file: str | None = None
    """CA bundle for a ``rediss://`` or ``rediss+sentinel://`` REDIS_URL (else the system's
    trust store)."""
    redis_sentinel_user: str | None = None
    """Who we log in as to the sentinels of a ``redis+sentinel://`` REDIS_URL."""
    redis_sentinel_password: SecretStr | None = None
    """The sentinels' own password (REDIS_URL's or ``redis_password`` is the data nodes')."""
    subject_prefix: str = Field(default="ckpt", pattern=r"^[A-Za-z0-9_-]+$")
    """First token of every subject."""
    events_stream: str = Field(default="CKPT_EVENTS", pattern=r"^[A-Za-z0-9_-]+$")
    """The JetStream stream of the events."""
    dead_letter_stream: str = Field(default="CKPT_DLQ", pattern=r"^[A-Za-z0-9_-]+$")
    """The JetStream stream of dead letters."""
    progress_stream: str = Field(default="CKPT_PROGRESS", pattern=r"^[A-Za-z0-9_-]*$")
    """The JetStream stream of ``job.progress`` and ``job.heartbeat``, kept under the limits
    below. Empty: they stay in the event stream, unbounded (a deployment not yet migrated by
    ``ckpt-ha streams provision``; docs/UPGRADES.md)."""
    progress_max_age_s: float = Field(default=86400.0, ge=0)
    """``streams provision``: reports older than this leave the progress stream (0: kept)."""
    progress_per_job: int = Field(default=100, ge=-1)
    """``streams provision``: reports kept per job and event type, the newest (-1: all)."""
    progress_max_bytes: int = Field(default=4 * 1024**3, ge=-1)
    """``streams provision``: the progress stream's size; the oldest reports go first (-1:
    no cap)."""
    stream_replicas: int = Field(default=1, ge=1, le=5)
    """Replicas ``ckpt-ha streams provision`` gives the streams: 3 on the three-node cluster
    (deploy/nats/nats-cluster.conf), 1 on a single server. Services check at least this many."""
    registry_prefix: str = Field(default="ckpt-ha", pattern=r"^[A-Za-z0-9_:.-]+$")
    """Prefix of every Redis key of the registry."""
    applied_window_s: float = Field(default=3600.0, gt=0)
    """How long the registry remembers an applied event id (counted from the event's time) to
    ignore it when heard again; older ids are trimmed (the record's history still knows every
    event that changed it). Keep it well above every way a message comes back: JetStream's
    duplicate window (120 s) and a redelivery (``max_deliver`` times ``ack_wait_s`` plus the
    back-off). The registrar and ``registry rebuild`` must use the same."""
    storage_root: str = Field(default=str(Path.home() / ".ckpt-ha" / "storage"))
    """Where checkpoints live: a plain path, ``file:///path`` or ``s3://bucket/prefix``."""
    http_host: str = "127.0.0.1"
    """Address /metrics, /livez and /readyz listen on: ``0.0.0.0`` (or ``::``) in a container,
    so that the kubelet and Prometheus reach them."""
    http_port: int = Field(default=0, ge=0, le=65535)
    """Port of that endpoint; fix it in a container (e.g. 8080). 0 picks a free port, written
    to the log and the local stack's status file."""
    ack_wait_s: float = Field(default=30.0, gt=0)
    """How long a delivery may stay unacknowledged before JetStream redelivers it."""
    max_deliver: int = Field(default=5, ge=2, le=100)
    """Deliveries of one message before it is dead-lettered (the bus's own cap: JetStream's is
    unlimited)."""
    backoff_s: tuple[float, ...] = (1.0, 5.0, 15.0, 30.0)
    """Waits before each redelivery of a nak'ed message (a JSON list)."""
    park_delay_s: float = Field(default=300.0, gt=0)
    """An event of a version newer than this service knows is offered again after this long
    (parked for a newer consumer during a rolling upgrade, never dead-lettered for it;
    docs/UPGRADES.md)."""
    fetch_batch: int = Field(default=64, ge=1, le=1024)
    """Messages pulled per fetch."""
    projection_batch: int = Field(default=256, ge=1, le=1024)
    """Messages a batch consumer (the registrar's projection) pulls per fetch: its Redis work
    is two round trips per batch, so a larger batch costs less per event. All of a batch is
    held (in-progress acks) until the batch is settled."""
    graceful_timeout_s: float = Field(default=20.0, gt=0)
    """On SIGTERM, how long in-flight handlers may finish before the process stops (the rest
    are redelivered)."""
    handler_deadline_s: float = Field(default=900.0, gt=0)
    """How long a handler may take for one delivery (or batch) before it is cancelled and the
    message nak'ed for a later delivery (the last one dead-letters)."""
    nats_connect_timeout_s: float = Field(default=5.0, gt=0)
    """Bound on one attempt to connect to NATS."""
    nats_reconnect_wait_s: float = Field(default=1.0, gt=0)
    """First wait before reconnecting to NATS; doubles per failed attempt (jittered)."""
    nats_reconnect_wait_max_s: float = Field(default=30.0, gt=0)
    """Cap of that wait: a service retries at least this often, for as long as it runs."""
    nats_ping_interval_s: float = Field(default=10.0, gt=0)
    """A server that misses two pings in a row counts as lost (a frozen broker)."""
    nats_request_timeout_s: float = Field(default=5.0, gt=0)
    """Bound on each JetStream API call (stream/consumer info, stored messages)."""
    redis_timeout_s: float = Field(default=5.0, gt=0)
    """Bound on each Redis reply (a frozen Redis: the handler fails and naks)."""
    redis_connect_timeout_s: float = Field(default=5.0, gt=0)
    """Bound on opening a Redis connection."""
    redis_retries: int = Field(default=3, ge=0, le=20)
    """Retries of a Redis command that met a connection error, with jittered backoff."""
    storage_timeout_s: float = Field(default=300.0, gt=0)
    """Bound on each storage call a service waits for (a listing, a checkpoint's verification,
    a move or a deletion); a hung mount then counts as unavailable instead of holding on."""
    storage_workers: int = Field(default=8, ge=1, le=256)
    """Threads doing storage calls (stuck ones included: at most this many can hang)."""
    dependency_check_interval_s: float = Field(default=5.0, gt=0)
    """How often NATS and Redis are checked for ``ckpt_ha_dependency_up`` on /metrics."""
    consumer_info_interval_s: float = Field(default=10.0, gt=0)
    """How often each durable consumer's pending/ack-pending counts are read for /metrics."""
    loop_lease_s: float = Field(default=15.0, gt=0)
    """Lifetime of the lease a replica holds on a periodic loop (the writer-watcher's scan, the
    integrity-checker's scrub and reconcile, the retention-janitor's rounds), renewed every
    third of it: one replica of a service runs each loop, and another takes it over within this
    long after its holder dies."""
    state_metrics_interval_s: float = Field(default=15.0, gt=0)
    """How often each replica reads the level metrics it exports from Redis (the registrar's
    open writes, the coordinator's jobs that need someone): every replica exports the same."""
    metrics_forget_after_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """A job idle this long leaves the per-job metric series (bounds their cardinality)."""
    signing_key: SecretStr | None = None
    """The master key job signatures derive from (hex, at least 16 bytes; docs/SECURITY.md).
    Services refuse to start without one."""
    signing_key_previous: SecretStr | None = None
    """During a rotation: the old master key, still accepted for verification (never signs)."""
    unsigned_before_seq: int = Field(default=0, ge=0)
    """Upgrading a stream written before signing: its events below this sequence need none."""

    def signing_keys(self) -> tuple[bytes, ...]:
        """The master keys, the signing one first; raises ValueError on a malformed one."""
        texts: list[str] = []
        if self.signing_key is not None:
            texts.append(self.signing_key.get_secret_value())
        if self.signing_key_previous is not None:
            texts.append(self.signing_key_previous.get_secret_value())
        return tuple(signing.parse_master(t) for t in texts)

    def require_signing_keys(self) -> tuple[bytes, ...]:
        keys = self.signing_keys()
        if not keys:
            raise MissingSigningKey
        return keys

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            SecretSources(settings_cls),
            env_settings,
            dotenv_settings,
            file_secret_settings,
        )

    def redis(self) -> RedisConfig:
        return RedisConfig(
            url=self.redis_url,
            user=self.redis_user,
            password=self.redis_password,
            ca_file=self.redis_ca_file,
            timeout_s=self.redis_timeout_s,
            connect_timeout_s=self.redis_connect_timeout_s,
            retries=self.redis_retries,
            sentinel_user=self.redis_sentinel_user,
            sentinel_password=self.redis_sentinel_password,
        )

    def bus(self) -> BusConfig:
        return BusConfig(
            url=self.nats_url,
            user=self.nats_user,
            password=self.nats_password,
            ca_file=self.nats_ca_file,
            prefix=self.subject_prefix,
            events_stream=self.events_stream,
            dead_letter_stream=self.dead_letter_stream,
            progress_stream=self.progress_stream,
            progress_max_age_s=self.progress_max_age_s,
            progress_per_job=self.progress_per_job,
            progress_max_bytes=self.progress_max_bytes,
            replicas=self.stream_replicas,
            ack_wait_s=self.ack_wait_s,
            max_deliver=self.max_deliver,
            backoff_s=self.backoff_s,
            park_delay_s=self.park_delay_s,
            fetch_batch=self.fetch_batch,
            projection_batch=self.projection_batch,
            graceful_timeout_s=self.graceful_timeout_s,
            request_timeout_s=self.nats_request_timeout_s,
            handler_deadline_s=self.handler_deadline_s,
            connect_timeout_s=self.nats_connect_timeout_s,
            reconnect_wait_s=self.nats_reconnect_wait_s,
            reconnect_wait_max_s=max(self.nats_reconnect_wait_max_s, self.nats_reconnect_wait_s),
            ping_interval_s=self.nats_ping_interval_s,
            signing_keys=self.signing_keys(),
            unsigned_before_seq=self.unsigned_before_seq,
        )
