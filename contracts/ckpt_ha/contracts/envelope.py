"""The one envelope every event travels in, and the catalogue that decodes it.

The envelope uses CloudEvents 1.0 attribute names (``id``, ``source``, ``type``, ``specversion``,
``time``, ``subject``, ``datacontenttype``) plus the CloudEvents distributed-tracing extension
(``traceparent``, ``tracestate``), so one checkpoint is one trace across services.

``type`` carries the version: ``ckpt-ha.checkpoint.committed.v1``. A compatible change (a new
optional field) keeps the version; a breaking change is a new version registered with an upcaster
from the previous one, and consumers keep decoding both into the newest model.

Every value is bounded (`ckpt_ha.contracts.bounds`: integers within 2**53-1, finite floats,
strings and mappings of bounded size), and decoding is bounded too: at most `MAX_EVENT_BYTES`,
JSON nested at most 200 levels deep (the parser's own limit), integers of at most 4,300 digits
before validation narrows them. Any bytes outside that are a `ContractError`, never another
exception, so a consumer dead-letters the one bad message and handles its neighbours. The
bounds were added to the v1 events without a new version: the values they refuse were never
decodable end to end (see `bounds`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar, Generic, Literal, NamedTuple, TypeVar

import pydantic_core
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from ckpt_ha.contracts.bounds import Label
from ckpt_ha.contracts.errors import (
    EventTooLarge,
    MalformedEvent,
    SubjectMismatch,
    UnknownEventType,
    UnsupportedEventVersion,
)
from ckpt_ha.contracts.subjects import EventAddress

TYPE_PREFIX = "ckpt-ha"
MAX_EVENT_BYTES = 256 * 1024
"""Events describe checkpoints; they never carry checkpoint bytes. Anything larger is a bug."""

EVENT_ID_NAMESPACE = uuid.UUID("6f1d3c1e-5b0a-4a59-9a57-1f0c7c3b2e11")

_TYPE_RE = re.compile(r"^ckpt-ha\.([a-z_]+\.[a-z_]+)\.v([1-9][0-9]{0,3})$")

Identifier = str
"""Opaque ids (job, run, checkpoint, plan): 1-200 printable characters, never parsed."""


class EventData(BaseModel):
    """Base of every event payload: frozen, closed to unknown fields, tagged with type+version."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    EVENT_TYPE: ClassVar[str]
    """Dotted name without version, e.g. ``checkpoint.committed``."""
    EVENT_VERSION: ClassVar[int]

    job_id: str = Field(min_length=1, max_length=200, pattern=r"^[^\s\x00-\x1f]+$")

    def subject_key(self) -> str:
        """What the event is about (CloudEvents ``subject``): the checkpoint, plan or job."""
        return self.job_id

    @classmethod
    def type_name(cls) -> str:
        return f"{TYPE_PREFIX}.{cls.EVENT_TYPE}.v{cls.EVENT_VERSION}"


D = TypeVar("D", bound=EventData, covariant=True)
P = TypeVar("P", bound=EventData)


class Envelope(BaseModel, Generic[D]):
    """A CloudEvents 1.0 event with a typed payload and W3C trace context."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    specversion: Literal["1.0"] = "1.0"
    id: str = Field(min_length=1, max_length=200)
    source: str = Field(min_length=1, max_length=200)
    type: str = Field(pattern=_TYPE_RE.pattern)
    time: AwareDatetime
    subject: str = Field(min_length=1, max_length=200)
    datacontenttype: Literal["application/json"] = "application/json"
    traceparent: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
    )
    tracestate: Label | None = None
    data: D

    @property
    def event_type(self) -> str:
        return self.data.EVENT_TYPE

    @property
    def version(self) -> int:
        return self.data.EVENT_VERSION

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()


def derive_event_id(event_type: str, subject: str, key: str) -> str:
    """Deterministic id: the same fact (type, subject, causing key) always gets the same id.

    It doubles as ``Nats-Msg-Id``, so a publish retried after a lost ack is dropped by JetStream's
    duplicate window, and consumers dedupe on it.
    """
    return str(uuid.uuid5(EVENT_ID_NAMESPACE, f"{event_type}|{subject}|{key}"))


_ENVELOPE_OF: dict[type[EventData], type[Envelope[Any]]] = {}
"""``Envelope[model]`` per model `build` was given, made once (pydantic looks a subscript up
anew, at some cost, each time): bounded by the models defined."""


def _envelope_of(model: type[EventData]) -> type[Envelope[Any]]:
    found: type[Envelope[Any]] = Envelope[model]  # type: ignore[valid-type]
    _ENVELOPE_OF[model] = found
    return found


def build(
    data: P,
    *,
    source: str,
    time: datetime,
    key: str,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> Envelope[P]:
    """Wrap a payload; ``key`` names what caused the event (e.g. the causing event's id)."""
    subject = data.subject_key()
    envelope_type = _ENVELOPE_OF.get(type(data)) or _envelope_of(type(data))
    return envelope_type(
        id=derive_event_id(data.type_name(), subject, key),
        source=source,
        type=data.type_name(),
        time=time,
        subject=subject,
        traceparent=traceparent,
        tracestate=tracestate,
        data=data,
    )


Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class EventCatalog:
    """Known event models by (type, version), with upcasters between consecutive versions."""

    def __init__(self, max_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_bytes = max_bytes
        self._models: dict[tuple[str, int], type[EventData]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._versions: dict[str, tuple[int, ...]] = {}
        """`versions` per type, worked out once (every decode asks): cleared by `register`."""
        self._decoders: dict[bytes, _Decoder] = {}
        """A known version's ``type`` attribute as it appears on the wire → how to decode it
        (`_Decoder`): every version's, not only the newest's, so an older one (a runner's
        ``job.failed`` v2) skips the one-pass attempt without working out its type again.
        Only known versions are kept; cleared by `register`."""
        self._envelopes: dict[str, type[Envelope[Any]]] = {}
        """Per type, the envelope class parametrised with its newest model (pydantic looks
        ``Envelope[model]`` up anew, at some cost, on each subscript); cleared by `register`."""

    def register(self, model: type[EventData]) -> type[EventData]:
        self._models[(model.EVENT_TYPE, model.EVENT_VERSION)] = model
        self._versions.clear()
        self._decoders.clear()
        self._envelopes.clear()
        return model

    def upcaster(self, event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Register a function turning ``from_version`` data into ``from_version + 1`` data."""

        def deco(fn: Upcaster) -> Upcaster:
            self._upcasters[(event_type, from_version)] = fn
            return fn

        return deco

    def versions(self, event_type: str) -> tuple[int, ...]:
        found = self._versions.get(event_type)
        if found is None:
            found = tuple(sorted(v for t, v in self._models if t == event_type))
            self._versions[event_type] = found
        return found

    def types(self) -> tuple[str, ...]:
        return tuple(sorted({t for t, _ in self._models}))

    def latest(self, event_type: str) -> type[EventData]:
        versions = self.versions(event_type)
        if not versions:
            raise UnknownEventType(event_type)
        return self._models[(event_type, versions[-1])]

    def models(self) -> Mapping[tuple[str, int], type[EventData]]:
        return dict(self._models)

    def decode(self, raw: bytes, address: EventAddress | None = None) -> Envelope[EventData]:
        """Bytes → envelope with the newest model for its type, upcasting older versions.

        With ``address`` (what the subject the bytes arrived on says), the body must agree with
        it: same type, same version as published, same job; else `SubjectMismatch`.

        Raises a `ContractError` subclass, never anything else, for any bad input.
        """
        if len(raw) > self.max_bytes:
            raise EventTooLarge(len(raw), self.max_bytes)
        fast = self._decode_current(raw)
        if fast is not None:
            _check_address(address, fast.event_type, fast.version, fast.data.job_id)
            return fast
        event, published_version = self._decode_general(raw)
        _check_address(address, event.event_type, published_version, event.data.job_id)
        return event

    def _decode_general(self, raw: bytes) -> tuple[Envelope[EventData], int]:
        """The envelope (upcast to the newest version) and the version it was published as."""
        try:
            # ValueError covers every refusal: not UTF-8, not JSON, NaN/Infinity, nesting deeper
            # than 200 levels, an integer of more than 4,300 digits.
            doc = pydantic_core.from_json(raw, allow_inf_nan=False)
        except (ValueError, RecursionError) as exc:
            raise MalformedEvent(f"not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise MalformedEvent("an event must be a JSON object")
        type_attr = doc.get("type")
        if not isinstance(type_attr, str):
            raise MalformedEvent("missing or non-string 'type'")
        match = _TYPE_RE.match(type_attr)
        if match is None:
            raise UnknownEventType(type_attr)
        event_type, version = match.group(1), int(match.group(2))
        known = self.versions(event_type)
        if not known:
            raise UnknownEventType(type_attr)
        if version not in known:
            raise UnsupportedEventVersion(event_type, version, known)
        data = doc.get("data")
        if not isinstance(data, dict):
            raise MalformedEvent("missing or non-object 'data'")
        for step in range(version, known[-1]):
            up = self._upcasters.get((event_type, step))
            if up is None:
                raise UnsupportedEventVersion(event_type, version, known)
            try:
                data = up(data)
            except (KeyError, TypeError, ValueError) as exc:
                raise MalformedEvent(f"cannot upcast v{step}: {exc!r}") from None
        model = self._models[(event_type, known[-1])]
        try:
            event = self._envelope(event_type, model).model_validate(
                {**doc, "type": model.type_name(), "data": data}
            )
        except ValidationError as exc:
            raise MalformedEvent(_summarise(exc)) from None
        return event, version

    def _decode_current(self, raw: bytes) -> Envelope[EventData] | None:
        """One-pass parse for the common case: an event of the newest version.

        Anything unusual (no ``type`` near the start, an older version, a validation error, a
        ``type`` that was not the envelope's own) returns None and takes the general path,
        which also produces the precise error.
        """
        match = _TYPE_PEEK.search(raw, 0, 512)
        if match is None:
            return None
        decoder = self._decoders.get(match.group(1))
        if decoder is None:
            decoder = self._decoder(match.group(1))
        if decoder is None or not decoder.newest:
            return None
        try:
            event = decoder.envelope.model_validate_json(raw)
        except ValidationError:
            return None
        return event if event.type == decoder.type_name else None

    def _decoder(self, type_attr: bytes) -> _Decoder | None:
        """How to decode ``type_attr`` when it names a known version (kept in ``_decoders``),
        else None."""
        t = _TYPE_RE.match(type_attr.decode("ascii", "replace"))
        if t is None:
            return None
        event_type, version = t.group(1), int(t.group(2))
        versions = self.versions(event_type)
        if version not in versions:
            return None
        model = self._models[(event_type, versions[-1])]
        found = _Decoder(
            model.type_name(), self._envelope(event_type, model), version == versions[-1]
        )
        self._decoders[type_attr] = found
        return found

    def _envelope(self, event_type: str, model: type[EventData]) -> type[Envelope[Any]]:
        """``Envelope[model]`` for ``event_type``'s newest model, made once."""
        found = self._envelopes.get(event_type)
        if found is None:
            found = Envelope[model]  # type: ignore[valid-type]
            self._envelopes[event_type] = found
        return found


class _Decoder(NamedTuple):
    """How the catalogue decodes one version of a type: into the newest model's envelope,
    in one pass (``newest``) or through the upcasters (`EventCatalog._decode_general`)."""

    type_name: str
    envelope: type[Envelope[Any]]
    newest: bool


_TYPE_PEEK = re.compile(rb'"type"\s*:\s*"([^"\\]{1,100})"')


def _check_address(address: EventAddress | None, event_type: str, version: int, job: str) -> None:
    if address is None:
        return
    if (address.event_type, address.version, address.job_id) != (event_type, version, job):
        said = f"{address.event_type} v{address.version} for job {address.job_id!r}"
        body = f"{event_type} v{version} for job {job!r}"
        raise SubjectMismatch(f"the subject says {said}, the body {body}")


def _summarise(exc: ValidationError) -> str:
    parts = [
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in exc.errors()[:5]
    ]
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
