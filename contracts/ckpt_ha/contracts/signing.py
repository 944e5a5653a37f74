"""Job signatures: a training job's credentials speak for its own job only.

Every training job and every scheduler adapter shares one NATS principal per role, and NATS
cannot bind a publish permission to a job id. So the events a job may publish about itself
(`SIGNED_TYPES`) carry a signature in the ``Ckpt-Signature`` header, made with a key only that
job holds:

* the operator keeps a **master key** (``CKPT_HA_SIGNING_KEY`` / ``..._FILE``), given to the
  services, the runner / scheduler adapters and the operator CLI, never to a training process;
* a job's key is ``HMAC-SHA256(master, "ckpt-ha/job-key/v1" 0x00 job_id)`` (`job_key`); the runner
  derives it and hands it to the training process in ``CKPT_HA_JOB_KEY`` (hex), so the process
  can sign for its own job and for no other;
* the signature is ``v1=`` + hex ``HMAC-SHA256(job key, subject 0x0A body)`` over the exact bytes
  published: it binds the body to its subject (type, version, job token) as well;
* the JetStream dedupe id of a signed event is keyed too (`message_id`), so nobody without the
  job's key can pre-empt a job's announcement by publishing first under its id.

Consumers verify with every master key they hold (the current one first, the previous one during
a rotation). An unsigned or wrongly signed event of a signed type is refused
(`UnsignedEvent`, `ForgedEvent`): dead-lettered, counted, never applied.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Iterable, Mapping

from ckpt_ha.contracts.errors import ForgedEvent, UnsignedEvent

HEADER = "Ckpt-Signature"
SCHEME = "v1"
_KEY_LABEL = b"ckpt-ha/job-key/v1\x00"
_MSG_ID_LABEL = b"ckpt-ha/msg-id/v1\x00"

SIGNED_TYPES: frozenset[str] = frozenset(
    {
        "job.started",
        "job.heartbeat",
        "job.progress",
        "job.failed",
        "job.succeeded",
        "resume.loaded",
        "resume.load_failed",
        "checkpoint.writing",
        "checkpoint.committed",
    }
)
"""Event types a job (or its scheduler adapter) publishes about itself. Every other type comes
from one service's own NATS principal only (deploy/nats/permissions.conf)."""

MIN_MASTER_BYTES = 16


@functools.lru_cache(maxsize=4096)
def job_key(master: bytes, job_id: str) -> bytes:
    """The key one job signs with; derived, so the master never leaves trusted processes.

    Cached: a consumer verifies every event of a job with the same derived key."""
    if len(master) < MIN_MASTER_BYTES:
        raise ValueError(f"a signing master key needs at least {MIN_MASTER_BYTES} bytes")
    return hmac.new(master, _KEY_LABEL + job_id.encode(), hashlib.sha256).digest()


def signature(key: bytes, subject: str, body: bytes) -> str:
    """The ``Ckpt-Signature`` header value for ``body`` published on ``subject``."""
    # One-shot hmac.digest: OpenSSL in one call, no Python HMAC object per event.
    mac = hmac.digest(key, subject.encode() + b"\n" + body, "sha256").hex()
    return f"{SCHEME}={mac}"


def message_id(key: bytes, event_id: str) -> str:
    """The ``Nats-Msg-Id`` of an event signed with ``key`` (a job's key).

    JetStream drops a second message with an id it saw within its duplicate window. Were the id
    the event id alone (derived from public facts), anyone could publish garbage under the id a
    job's real announcement will have and so suppress it. With a keyed part only the job's key
    holders can make it; and since it depends on the event id only, the SDK's announcement and
    the writer-watcher's report of the same checkpoint still share it (one of them is stored)."""
    mac = hmac.new(key, _MSG_ID_LABEL + event_id.encode(), hashlib.sha256).hexdigest()
    return f"{event_id}:{mac[:16]}"


def verify(
    masters: Iterable[bytes],
    job_id: str,
    subject: str,
    body: bytes,
    headers: Mapping[str, str] | None,
) -> None:
    """Raise `UnsignedEvent` / `ForgedEvent` unless ``headers`` carry a signature of ``body`` on
    ``subject`` made with ``job_id``'s key under one of ``masters``."""
    given = (headers or {}).get(HEADER)
    if not given:
        raise UnsignedEvent(f"no {HEADER} header: events of this type must be signed by their job")
    for master in masters:
        if hmac.compare_digest(given, signature(job_key(master, job_id), subject, body)):
            return
    raise ForgedEvent(f"the {HEADER} header does not verify for job {job_id!r}")


def parse_master(text: str) -> bytes:
    """A master key as configured: hex (at least 32 digits); raises ValueError otherwise."""
    try:
        raw = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError("a signing key must be hex digits") from None
    if len(raw) < MIN_MASTER_BYTES:
        raise ValueError(f"a signing key needs at least {MIN_MASTER_BYTES} bytes (32 hex digits)")
    return raw
