"""Errors raised while decoding bytes from the wire into contract models.

Every one of them is permanent: the same bytes will fail the same way on every redelivery, so the
bus dead-letters them instead of retrying.
"""

from __future__ import annotations


class ContractError(ValueError):
    """Bytes on the wire that do not form a valid, known event."""

    code = "contract_error"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{self.code}: {reason}")


class MalformedEvent(ContractError):
    """Not JSON, not an object, or a field fails validation."""

    code = "malformed"


class UnknownEventType(ContractError):
    """The `type` attribute names no event in the catalogue."""

    code = "unknown_type"

    def __init__(self, event_type: str) -> None:
        self.event_type = event_type
        super().__init__(f"no event type {event_type!r} in the catalogue")


class UnsupportedEventVersion(ContractError):
    """The event type is known but this version is not (newer than this consumer, or retired)."""

    code = "unsupported_version"

    def __init__(self, event_type: str, version: int, known: tuple[int, ...]) -> None:
        self.event_type = event_type
        self.version = version
        self.known = known
        super().__init__(f"{event_type} v{version} is not accepted here (known versions: {known})")


class EventTooLarge(ContractError):
    """The payload exceeds the catalogue's size limit."""

    code = "too_large"

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"payload of {size} bytes exceeds the limit of {limit} bytes")


class SubjectMismatch(ContractError):
    """The body says another type, version or job than the subject it was published on.

    Publish permissions are granted per subject; a body that disagrees with its subject would
    let a principal speak outside its grant, so it is refused, never interpreted."""

    code = "subject_mismatch"


class UnsignedEvent(ContractError):
    """An event a training job may publish arrived without its job's signature."""

    code = "unsigned"


class ForgedEvent(ContractError):
    """An event's job signature does not verify: it was not published with that job's key."""

    code = "forged"
