"""Who owns a storage location, and what removing one may touch. Pure.

A job owns one folder under the storage root, ``<root>/<job folder>/``: the job folder is the
job id when that id is one safe path component (`job_folder`); a job whose id is not one owns
no location at all. A checkpoint's location (a key relative to the storage root, as
`ckpt_ha.storage.key_for_uri` derives it from the URI) is its job's when it lies strictly
under that folder; the bytes quarantine moves aside lie under ``quarantine/<job folder>/``.
The folder name decides, never what a manifest or an event claims: a job cannot name its way
into another job's folder.

Records belong to their job: an event about a checkpoint changes its record only when it names
the record's job (`JobMismatch`, checked by the projection in `ckpt_ha.core.records`).

Removing (deleting or quarantining) one record's bytes never touches another live record's:
`plan_removal` says, for one location, which other live records sit at the same path, around
it, or inside it; the caller removes nothing in the first two cases and skips the subtrees of
the third.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ckpt_ha.contracts import EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointQuarantinedV1,
    CheckpointReleasedV1,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
)
from ckpt_ha.core.errors import PermanentError

QUARANTINE = "quarantine"
"""The top folder quarantined bytes are moved under (`ckpt_ha.storage.quarantine`). Reserved:
no job owns it, or a job named so would own every quarantined checkpoint."""

RESERVED = frozenset({QUARANTINE})

_UNSAFE = re.compile(r"[/\\\s\x00-\x1f\x7f]")
"""What a job folder's name never holds: a separator, whitespace (``\\s`` is what
`str.isspace` calls whitespace) or a control character. One regex search per event, not a
Python loop over the id's characters."""
_DOTTED = frozenset(("", ".", ".."))

KeyOf = Callable[[str], "str | None"]
"""A URI → its key in the storage root (None: outside it); `ckpt_ha.storage.key_for_uri`."""


def job_folder(job_id: str) -> str | None:
    """The folder ``job_id`` owns under the storage root, or None when it owns none.

    The id itself when it is one safe path component: not empty, no ``/`` or ``\\``, not ``.``
    or ``..``, no whitespace or control character, and not a reserved top folder. The SDK
    writes a job's checkpoints there (`ckpt_ha.sdk.folder_for`) and refuses any other job id.
    """
    if not job_id or job_id in (".", "..") or job_id in RESERVED:
        return None
    if _UNSAFE.search(job_id) is not None:
        return None
    return job_id


def _parts(key: str) -> list[str] | None:
    """The components of a normalised relative key (None: empty, absolute, dotted, NUL)."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        return None
    parts = key.split("/")
    if not _DOTTED.isdisjoint(parts):
        return None
    return parts


def folder_job(key: str) -> str | None:
    """The job owning the location ``key``: its first component, when that is a job folder and
    the key lies strictly under it (None: nobody's, e.g. ``quarantine/…`` or a bad name)."""
    parts = _parts(key)
    if parts is None or len(parts) < 2:
        return None
    return job_folder(parts[0])


def not_owned(job_id: str, key: str | None) -> str | None:
    """Why the location ``key`` is not ``job_id``'s (None: it is). ``key`` None: outside the
    storage root."""
    folder = job_folder(job_id)
    if folder is None:
        return f"job id {job_id!r} is not one path component, so the job owns no location"
    if key is None:
        return "it is outside the storage root"
    parts = _parts(key)
    if parts is None:
        return f"{key!r} is not a plain relative path (empty, '.' or '..' components)"
    if parts[0] != folder:
        return f"it lies in folder {parts[0]!r}, not in the job's own folder {folder!r}"
    if len(parts) < 2:
        return f"it is the job's folder {folder!r} itself, not a checkpoint folder under it"
    return None


def quarantine_not_owned(job_id: str, key: str | None) -> str | None:
    """Why ``key`` is not a place for ``job_id``'s quarantined bytes (None: it is): those lie
    strictly under ``quarantine/<job folder>/``."""
    folder = job_folder(job_id)
    if folder is None:
        return f"job id {job_id!r} is not one path component, so the job owns no location"
    if key is None:
        return "it is outside the storage root"
    parts = _parts(key)
    if parts is None or len(parts) < 3 or parts[:2] != [QUARANTINE, folder]:
        return f"it does not lie under {QUARANTINE}/{folder}/"
    return None


class LocationNotOwned(PermanentError):
    """An event or action names a location its job does not own: refused, nothing is read,
    registered, moved or deleted there."""

    code = "location_not_owned"

    def __init__(self, job_id: str, checkpoint_id: str, uri: str, why: str) -> None:
        self.job_id = job_id
        self.checkpoint_id = checkpoint_id
        self.uri = uri
        self.why = why
        super().__init__(
            f"checkpoint {checkpoint_id} of job {job_id}: location {uri} is not the job's: {why}"
        )


class JobMismatch(PermanentError):
    """An event names one job about a record (or plan) of another, or a commit declares an
    identity of another job: refused, it changes nothing."""

    code = "job_mismatch"

    def __init__(self, job_id: str, checkpoint_id: str, what: str, why: str) -> None:
        self.job_id = job_id
        self.checkpoint_id = checkpoint_id
        self.what = what
        self.why = why
        super().__init__(
            f"{what} for job {job_id} about checkpoint {checkpoint_id}: {why}; refused, "
            "nothing changed"
        )


CREATORS = (CheckpointWritingV1, CheckpointCommittedV1, CheckpointWriteFailedV1)
"""The events that can create a record (and so fix its location for good)."""


def intake_refusal(data: EventData, key_of: KeyOf) -> LocationNotOwned | None:
    """Why the registry must not take ``data`` (None: nothing against it).

    An event that can create a record must name a location its job owns; a quarantine or a
    release naming where the bytes lie in quarantine must name the job's own quarantine
    folder (the janitor later deletes there). Events that only move an existing record carry
    the record's location for display; the projection checks their job instead.
    """
    checkpoint_id = str(getattr(data, "checkpoint_id", ""))
    if isinstance(data, CREATORS):
        why = not_owned(data.job_id, key_of(data.uri))
        if why is not None:
            return LocationNotOwned(data.job_id, checkpoint_id, data.uri, why)
    if isinstance(data, CheckpointQuarantinedV1 | CheckpointReleasedV1) and data.quarantine_uri:
        why = quarantine_not_owned(data.job_id, key_of(data.quarantine_uri))
        if why is not None:
            return LocationNotOwned(data.job_id, checkpoint_id, data.quarantine_uri, why)
    return None


# --- removing one record's bytes, never another's -------------------------------------------


def contains(outer: str, inner: str) -> bool:
    """True when the location ``inner`` is ``outer`` or lies under it."""
    return inner == outer or inner.startswith(f"{outer}/")


@dataclass(frozen=True)
class Neighbour:
    """Another live (not deleted) record's bytes: its checkpoint id and their key."""

    checkpoint_id: str
    key: str


@dataclass(frozen=True)
class Removal:
    """What removing the location ``key`` may touch."""

    key: str
    blocked_by: Neighbour | None = None
    """Another live record at this very location or around it: nothing here may go."""
    spared: tuple[Neighbour, ...] = ()
    """Other live records inside it: their subtrees stay."""

    def removes(self, object_key: str) -> bool:
        """Whether the object at ``object_key`` (at or under `key`) may be removed."""
        if self.blocked_by is not None or not contains(self.key, object_key):
            return False
        return not any(contains(n.key, object_key) for n in self.spared)

    @property
    def whole(self) -> bool:
        """Everything under the location may go."""
        return self.blocked_by is None and not self.spared

    def note(self) -> str:
        """What was kept and why, for a tombstone or a log ('' when nothing was)."""
        if self.blocked_by is not None:
            where = (
                "the same location"
                if self.blocked_by.key == self.key
                else f"{self.blocked_by.key}, around it"
            )
            return (
                f"kept everything at {self.key}: live checkpoint "
                f"{self.blocked_by.checkpoint_id} is at {where}"
            )
        if self.spared:
            kept = ", ".join(f"{n.key} (checkpoint {n.checkpoint_id})" for n in self.spared)
            return f"kept under {self.key} the folders of live checkpoints: {kept}"
        return ""


def plan_removal(key: str, neighbours: Iterable[Neighbour]) -> Removal:
    """How to remove the location ``key`` without touching any of ``neighbours`` (the other
    live records' locations): blocked when one sits at ``key`` itself or contains it, else
    sparing every one inside it."""
    spared: list[Neighbour] = []
    for n in sorted(neighbours, key=lambda n: (n.key, n.checkpoint_id)):
        if contains(n.key, key):
            return Removal(key, blocked_by=n)
        if contains(key, n.key):
            spared.append(n)
    return Removal(key, spared=tuple(spared))
