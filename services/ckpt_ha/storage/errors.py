"""Typed storage errors shared by every ObjectStore backend.

Callers decide retry vs give-up from `transient` alone: `StorageUnavailable` is transient (the
backend could not serve the request right now), everything else is permanent (retrying the same
call cannot succeed).
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class; carries the key, the backend and the reason, and builds its own message."""

    transient: bool = False

    def __init__(
        self,
        *,
        reason: str,
        key: str | None = None,
        backend: str | None = None,
        transient: bool | None = None,
    ) -> None:
        self.reason = reason
        self.key = key
        self.backend = backend
        if transient is not None:
            self.transient = transient
        where = f"{backend} storage" if backend else "storage"
        about = f" for key {key!r}" if key is not None else ""
        super().__init__(f"{where} error{about}: {reason}")


class ObjectNotFound(StorageError):
    def __init__(self, key: str, *, backend: str) -> None:
        super().__init__(reason="no such object", key=key, backend=backend)


class ObjectExists(StorageError):
    """A create-only write lost: the key already holds an object."""

    def __init__(self, key: str, *, backend: str) -> None:
        super().__init__(reason="object already exists", key=key, backend=backend)


class InvalidKey(StorageError):
    """The key (or prefix) breaks the key rules, or would escape the store root."""

    def __init__(self, key: str, *, reason: str, backend: str | None = None) -> None:
        super().__init__(reason=reason, key=key, backend=backend)


class InvalidMetadata(StorageError):
    """User metadata that S3 could not carry faithfully; rejected on every backend alike."""

    def __init__(self, *, reason: str, key: str | None = None) -> None:
        super().__init__(reason=reason, key=key)


class StorageUnavailable(StorageError):
    """The backend could not serve the request now (network, timeout, 5xx, EIO, ENOSPC...)."""

    transient = True

    def __init__(self, *, reason: str, backend: str, key: str | None = None) -> None:
        super().__init__(reason=reason, key=key, backend=backend)
