"""How an event is framed on NATS, written once for every producer and every consumer.

The services' bus (`ckpt_ha.bus`), the SDK in a training process (`ckpt_ha.sdk`) and the runner
publish the same envelope with the same subject and headers, and every consumer checks them the
same way (`ckpt_ha.bus.admission`). An event is:

* published on `subject` (type, version and job token: ``<prefix>.ev.<type>.v<N>.<job>``), its
  body the envelope's JSON bytes (`ckpt_ha.contracts.Envelope.to_bytes`);
* deduplicated by JetStream on ``Nats-Msg-Id`` (`MSG_ID`): the event id, or, for an event
  signed with its job's key, `message_id` (a keyed id nobody without the key can pre-empt);
* in its checkpoint's trace: ``traceparent`` / ``tracestate`` (W3C) when it has one;
* signed, for the types a job publishes about itself (`ckpt_ha.contracts.signing`):
  ``Ckpt-Signature: v1=<hex HMAC-SHA256(job key, subject 0x0A body)>`` (`signature`), over the
  exact bytes published, so it binds the body to its subject as well; `verify` checks it.

`headers` builds the header set in one order (dedupe id, trace, signature), so the same event
framed by the SDK or by a service is the same bytes on the wire.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

from ckpt_ha.contracts.envelope import Envelope, EventData
from ckpt_ha.contracts.errors import ForgedEvent, UnsignedEvent
from ckpt_ha.contracts.signing import job_key
from ckpt_ha.contracts.subjects import event_subject

MSG_ID = "Nats-Msg-Id"
"""JetStream's dedupe header: a second message with an id seen within the window is dropped."""
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SIGNATURE = "Ckpt-Signature"
"""The job's signature of the body on its subject (`signature`)."""
SCHEME = "v1"
_MSG_ID_LABEL = b"ckpt-ha/msg-id/v1\x00"


def subject(prefix: str, event: Envelope[EventData]) -> str:
    """The subject ``event`` is published on under ``prefix``."""
    return event_subject(prefix, event.event_type, event.version, event.data.job_id)


def headers(
    event_id: str,
    subject: str,
    body: bytes,
    *,
    key: bytes | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> dict[str, str]:
    """The NATS headers of ``body`` published on ``subject``: the dedupe id, the trace context
    (``tracestate`` only with a ``traceparent``), and, with a job's ``key``, its signature and
    the keyed dedupe id (`sign`)."""
    framed = {MSG_ID: event_id}
    if traceparent:
        framed[TRACEPARENT] = traceparent
        if tracestate:
            framed[TRACESTATE] = tracestate
    return framed if key is None else sign(framed, key, subject, body, event_id)


def sign(
    framed: dict[str, str], key: bytes, subject: str, body: bytes, event_id: str
) -> dict[str, str]:
    """``framed`` plus the signature made with ``key`` (a job's key) and the keyed dedupe id."""
    framed[SIGNATURE] = signature(key, subject, body)
    framed[MSG_ID] = message_id(key, event_id)
    return framed


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
    given = (headers or {}).get(SIGNATURE)
    if not given:
        raise UnsignedEvent(
            f"no {SIGNATURE} header: events of this type must be signed by their job"
        )
    for master in masters:
        if hmac.compare_digest(given, signature(job_key(master, job_id), subject, body)):
            return
    raise ForgedEvent(f"the {SIGNATURE} header does not verify for job {job_id!r}")
