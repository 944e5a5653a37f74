"""NATS subject names, in one place.

Layout: ``<prefix>.ev.<aggregate>.<name>.v<version>.<job>`` for events,
``<prefix>.dlq.<service>.<consumer>`` for dead letters and ``<prefix>.dlq.replayed.<seq>`` for
the record that a dead letter was replayed. The version token lets a consumer choose
which versions it reads; the job token lets consumers partition per job. Job ids may contain
characters NATS reserves (``.``, ``*``, ``>``, whitespace), so they are escaped reversibly.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_PREFIX = "ckpt"
EVENTS = "ev"
DEAD_LETTERS = "dlq"

_SAFE = re.compile(r"[A-Za-z0-9_-]")
_ALL_SAFE = re.compile(r"[A-Za-z0-9_-]*")


def job_token(job_id: str) -> str:
    """Escape a job id into one subject token (reversible, see `job_from_token`)."""
    if _ALL_SAFE.fullmatch(job_id):  # the common case, one match (every publish asks)
        return job_id
    return "".join(
        c if _SAFE.fullmatch(c) else "".join(f"~{b:02X}" for b in c.encode()) for c in job_id
    )


def job_from_token(token: str) -> str:
    """Invert `job_token`."""
    if "~" not in token:  # nothing escaped (the common case: every event admitted asks)
        return token
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "~":
            out.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            out.extend(token[i].encode())
            i += 1
    return out.decode()


def event_subject(prefix: str, event_type: str, version: int, job_id: str) -> str:
    """Subject one event is published on, e.g. ``ckpt.ev.checkpoint.committed.v1.job-7``."""
    return f"{prefix}.{EVENTS}.{event_type}.v{version}.{job_token(job_id)}"


@dataclass(frozen=True)
class EventAddress:
    """What an event subject says about the event it carries: type, version and job."""

    event_type: str
    version: int
    job_id: str


_VERSION_TOKEN = re.compile(r"^v([1-9][0-9]{0,3})$")


@functools.lru_cache(maxsize=8192)
def parse_event_subject(prefix: str, subject: str) -> EventAddress | None:
    """Invert `event_subject`; None when ``subject`` is not an event subject under ``prefix``.

    Cached (the answer is immutable): every delivery asks it at least twice (its admission,
    its delivery count), and a job's events share a handful of subjects."""
    tokens = subject.split(".")
    if len(tokens) != 6 or tokens[0] != prefix or tokens[1] != EVENTS:
        return None
    version = _VERSION_TOKEN.match(tokens[4])
    if version is None:
        return None
    try:
        job = job_from_token(tokens[5])
    except (ValueError, UnicodeDecodeError):
        return None
    if job_token(job) != tokens[5]:
        return None  # not the one canonical spelling of a job id: refuse, never guess
    return EventAddress(f"{tokens[2]}.{tokens[3]}", int(version.group(1)), job)


def event_filter(prefix: str, event_type: str | None = None, version: int | None = None) -> str:
    """Filter subject for one event type (all versions unless given) across all jobs."""
    if event_type is None:
        return f"{prefix}.{EVENTS}.>"
    ver = "*" if version is None else f"v{version}"
    return f"{prefix}.{EVENTS}.{event_type}.{ver}.*"


TELEMETRY = ("job.heartbeat", "job.progress")
"""Event types that report, not decide: an attempt's liveness and its training progress. They go
to their own stream, bounded by age and per job (`ckpt_ha.bus.streams`), so the event stream,
which the registry is rebuilt from, grows with what was decided, not with how long jobs ran."""


def telemetry_filters(prefix: str) -> list[str]:
    """The subjects of `TELEMETRY`, every version and job: the progress stream's."""
    return [event_filter(prefix, t) for t in TELEMETRY]


def is_telemetry(prefix: str, subject: str) -> bool:
    """Whether ``subject`` is a `TELEMETRY` event subject under ``prefix``."""
    tokens = subject.split(".")
    return (
        len(tokens) == 6
        and tokens[0] == prefix
        and tokens[1] == EVENTS
        and f"{tokens[2]}.{tokens[3]}" in TELEMETRY
    )


def record_filters(prefix: str, event_types: Iterable[str]) -> list[str]:
    """The event stream's subjects when telemetry has its own stream: JetStream takes no
    "all but", so each aggregate without telemetry is one wildcard and the others' event types
    are listed one by one (every version and job). A new event type of such an aggregate
    (``job``) needs ``ckpt-ha streams provision`` before it is published."""
    types = sorted(set(event_types) - set(TELEMETRY))
    mixed = {t.split(".")[0] for t in TELEMETRY}
    filters = {
        aggregate_filter(prefix, t.split(".")[0]) for t in types if t.split(".")[0] not in mixed
    }
    filters |= {event_filter(prefix, t) for t in types if t.split(".")[0] in mixed}
    return sorted(filters)


def job_event_filter(prefix: str, event_type: str, job_id: str) -> str:
    """Filter subject for one event type of one job, every version (a watcher of its own job's
    events keeps hearing them when a producer moves to a newer version)."""
    return f"{prefix}.{EVENTS}.{event_type}.*.{job_token(job_id)}"


def aggregate_filter(prefix: str, aggregate: str) -> str:
    """Filter subject for every event of one aggregate (``checkpoint``, ``job``, ``resume``)."""
    return f"{prefix}.{EVENTS}.{aggregate}.>"


def dead_letter_subject(prefix: str, service: str, consumer: str) -> str:
    """Subject a consumer's dead letters are published on."""
    return f"{prefix}.{DEAD_LETTERS}.{service}.{consumer}"


def dead_letter_filter(prefix: str) -> str:
    return f"{prefix}.{DEAD_LETTERS}.>"


REPLAYED = "replayed"
"""The dead-letter stream's subjects under ``<prefix>.dlq.replayed.`` are replay markers, not
dead letters (no service is named ``replayed``)."""


def replay_marker_subject(prefix: str, dead_letter_seq: int) -> str:
    """Where ``ckpt-ha dead-letters replay`` records that the dead letter stored at
    ``dead_letter_seq`` was re-published: one subject per dead letter, so whether it was is one
    lookup (the dead-letter stream refuses deletes, so a marker is the record)."""
    return f"{prefix}.{DEAD_LETTERS}.{REPLAYED}.{dead_letter_seq}"


def replay_marker_filter(prefix: str) -> str:
    return f"{prefix}.{DEAD_LETTERS}.{REPLAYED}.*"


INBOX = "_INBOX"
"""NATS's default inbox prefix: the one a connection without a login keeps."""


def inbox_prefix(user: str | None) -> str:
    """Where the replies of a connection logged in as ``user`` arrive: JetStream's publish
    acknowledgements and API answers, and the messages a pull consumer fetches (which carry
    events). Each NATS user gets its own, ``_INBOX_<user>``, and may subscribe under nothing
    else (`ckpt_ha.bus.permissions`): a shared ``_INBOX.>`` would let any principal read the
    events every service fetches."""
    return INBOX if not user else f"{INBOX}_{user}"
