"""NATS subject names, in one place.

Layout: ``<prefix>.ev.<aggregate>.<name>.v<version>.<job>`` for events and
``<prefix>.dlq.<service>.<consumer>`` for dead letters. The version token lets a consumer choose
which versions it reads; the job token lets consumers partition per job. Job ids may contain
characters NATS reserves (``.``, ``*``, ``>``, whitespace), so they are escaped reversibly.
"""

from __future__ import annotations

import re

DEFAULT_PREFIX = "ckpt"
EVENTS = "ev"
DEAD_LETTERS = "dlq"

_SAFE = re.compile(r"[A-Za-z0-9_-]")


def job_token(job_id: str) -> str:
    """Escape a job id into one subject token (reversible, see `job_from_token`)."""
    return "".join(
        c if _SAFE.fullmatch(c) else "".join(f"~{b:02X}" for b in c.encode()) for c in job_id
    )


def job_from_token(token: str) -> str:
    """Invert `job_token`."""
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


def event_filter(prefix: str, event_type: str | None = None, version: int | None = None) -> str:
    """Filter subject for one event type (all versions unless given) across all jobs."""
    if event_type is None:
        return f"{prefix}.{EVENTS}.>"
    ver = "*" if version is None else f"v{version}"
    return f"{prefix}.{EVENTS}.{event_type}.{ver}.*"


def aggregate_filter(prefix: str, aggregate: str) -> str:
    """Filter subject for every event of one aggregate (``checkpoint``, ``job``, ``resume``)."""
    return f"{prefix}.{EVENTS}.{aggregate}.>"


def dead_letter_subject(prefix: str, service: str, consumer: str) -> str:
    """Subject a consumer's dead letters are published on."""
    return f"{prefix}.{DEAD_LETTERS}.{service}.{consumer}"


def dead_letter_filter(prefix: str) -> str:
    return f"{prefix}.{DEAD_LETTERS}.>"
