"""What a consumer accepts from the stream: one check for every consumer and every replay.

A stored message becomes an event only if its subject is an event subject of this deployment,
its body agrees with that subject (type, version, job: `SubjectMismatch`), and, for the types a
job publishes about itself, it carries that job's signature (`ckpt_ha.contracts.framing`). The
live consumers (`Bus`), the registry rebuild and every other reader of the stream call `admit`, so
what one refuses the others refuse too. Every refusal is a `ContractError`: permanent, so the
consumer dead-letters it with its code and reason, and the dead-letter metric counts it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import Envelope, EventCatalog, EventData, framing, signing
from ckpt_ha.contracts.errors import SubjectMismatch
from ckpt_ha.contracts.subjects import parse_event_subject


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
        framing.verify(cfg.signing_keys, address.job_id, subject, body, headers)
    return catalog.decode(body, address)


def job_key(cfg: BusConfig, event: Envelope[EventData]) -> bytes | None:
    """The key ``event`` is signed with: its job's, when it is of a signed type and this process
    holds a master key (services, runners, the operator CLI); None otherwise."""
    if event.event_type in signing.SIGNED_TYPES and cfg.signing_keys:
        return signing.job_key(cfg.signing_keys[0], event.data.job_id)
    return None
