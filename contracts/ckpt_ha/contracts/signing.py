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
* the JetStream dedupe id of a signed event is keyed too, so nobody without the job's key can
  pre-empt a job's announcement by publishing first under its id.

Both are part of an event's framing on the wire, written once in `ckpt_ha.contracts.framing`
(`signature`, `message_id`, `verify`); this module holds the keys and which types need them.
Consumers verify with every master key they hold (the current one first, the previous one during
a rotation). An unsigned or wrongly signed event of a signed type is refused
(`UnsignedEvent`, `ForgedEvent`): dead-lettered, counted, never applied.
"""

from __future__ import annotations

import functools
import hashlib
import hmac

_KEY_LABEL = b"ckpt-ha/job-key/v1\x00"

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


def parse_master(text: str) -> bytes:
    """A master key as configured: hex (at least 32 digits); raises ValueError otherwise."""
    try:
        raw = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError("a signing key must be hex digits") from None
    if len(raw) < MIN_MASTER_BYTES:
        raise ValueError(f"a signing key needs at least {MIN_MASTER_BYTES} bytes (32 hex digits)")
    return raw
