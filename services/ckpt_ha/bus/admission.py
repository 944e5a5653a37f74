"""What a consumer accepts from the stream: one check for every consumer and every replay.

A stored message becomes an event only if its subject is an event subject of this deployment,
its body agrees with that subject (type, version, job: `SubjectMismatch`), and, for the types a
job publishes about itself, it carries that job's signature (`ckpt_ha.contracts.signing`). The
live consumers (`Bus`), the registry rebuild and every other reader of the stream call `admit`, so
what one refuses the others refuse too. Every refusal is a `ContractError`: permanent, so the
consumer dead-letters it with its code and reason, and the dead-letter metric counts it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import Envelope, EventCatalog, EventData, signing
from ckpt_ha.contracts.errors import SubjectMismatch
from ckpt_ha.contracts.subjects import event_subject, parse_event_subject


def admit(
    cfg: BusConfig,
    catalog: EventCatalog,
    body: bytes,
    subject: str,
    headers: Mapping[str, str] | None,
    stream_seq: int | None = None,
) -> Envelope[EventData]:
    """The event ``body`` (stored at ``stream_seq`` on ``subject``), or a `ContractError`."""
    address = parse_event_subject(cfg.prefix, subject)
    if address is None:
        raise SubjectMismatch(f"{subject!r} is not an event subject under {cfg.prefix!r}")
    predates_signing = stream_seq is not None and stream_seq < cfg.unsigned_before_seq
    if address.event_type in signing.SIGNED_TYPES and not predates_signing:
        # Before parsing: a body its job did not sign is never interpreted.
        signing.verify(cfg.signing_keys, address.job_id, subject, body, headers)
    return catalog.decode(body, address)


def signed_headers(
    cfg: BusConfig, event: Envelope[EventData], body: bytes, headers: dict[str, str]
) -> dict[str, str]:
    """``headers`` plus the job signature (and the keyed dedupe id) when ``event`` is of a
    signed type and this process holds a master key (services, runners, the operator CLI)."""
    if event.event_type in signing.SIGNED_TYPES and cfg.signing_keys:
        subject = subject_of(cfg, event)
        key = signing.job_key(cfg.signing_keys[0], event.data.job_id)
        headers[signing.HEADER] = signing.signature(key, subject, body)
        headers["Nats-Msg-Id"] = signing.message_id(key, event.id)
    return headers


def subject_of(cfg: BusConfig, event: Envelope[EventData]) -> str:
    return event_subject(cfg.prefix, event.event_type, event.version, event.data.job_id)
