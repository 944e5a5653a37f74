"""The streams belong to the operator: provisioned once, checked by everyone else.

The event stream is the source of truth (the registry is rebuilt from it), so no service and no
job may create, change, purge or delete it: their NATS principals have no such permission, and
the streams refuse message deletion and purges (``deny_delete``, ``deny_purge``, no roll-up
headers). `provision` (``ckpt-ha streams provision``, run under the operator principal) creates
the streams or brings them to this configuration; every service runs `check` at start and refuses
to run against a stream that differs, naming each difference, instead of rewriting it. A
registry rebuild first asks `require_complete`: a stream whose first sequence is not 1 lost
events, and a rebuild from it would silently forget checkpoints.

Three streams: the events (unlimited: everything decided), the dead letters, and the progress
stream: ``job.progress`` and ``job.heartbeat`` (`ckpt_ha.contracts.subjects.TELEMETRY`), which
report and decide nothing, kept under limits (age, newest reports per job, bytes; the oldest go
first). JetStream refuses two streams capturing one subject, so the event stream then lists
its subjects instead of ``<prefix>.ev.>`` (`record_filters`). A deployment whose event stream
still captures telemetry is migrated by `provision`: it narrows the event stream first (the
reports already in it stay there), then creates the progress stream. The progress stream's
limits are the operator's to tune (``CKPT_HA_PROGRESS_*`` at provisioning); services check its
subjects and protections, not its limits.
"""

from __future__ import annotations

from typing import Any

from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import CATALOG, EventCatalog
from ckpt_ha.contracts.subjects import (
    dead_letter_filter,
    event_filter,
    record_filters,
    telemetry_filters,
)
from ckpt_ha.core.errors import PermanentError


class StreamMisconfigured(PermanentError):
    """A stream is missing or differs from what ckpt-ha needs; only the operator may fix it."""

    code = "stream_misconfigured"

    def __init__(self, stream: str, problems: list[str]) -> None:
        self.stream = stream
        self.problems = problems
        super().__init__(
            f"stream {stream}: {'; '.join(problems)} "
            "(an operator runs `ckpt-ha streams provision`; services never change streams)"
        )


class StreamTruncated(PermanentError):
    """The event stream no longer starts at sequence 1: events were removed from its start."""

    code = "stream_truncated"

    def __init__(self, stream: str, first_seq: int, messages: int) -> None:
        self.stream = stream
        self.first_seq = first_seq
        super().__init__(
            f"stream {stream} starts at sequence {first_seq}, not 1 ({messages} messages kept): "
            f"events 1..{first_seq - 1} were purged or removed, so a rebuild from it would "
            "silently lose checkpoints; restore the stream from a backup first"
        )


def desired(cfg: BusConfig, catalog: EventCatalog = CATALOG) -> list[StreamConfig]:
    """The event stream, the dead-letter stream and the progress stream (unless
    ``cfg.progress_stream`` is empty) as ckpt-ha needs them, in the order `provision` applies
    them: the event stream gives up the telemetry subjects before the progress stream takes
    them."""
    common: dict[str, Any] = {
        "storage": StorageType.FILE,
        "retention": RetentionPolicy.LIMITS,
        "discard": DiscardPolicy.OLD,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": 0,
        "max_msgs_per_subject": -1,
        "duplicate_window": cfg.duplicate_window_s,
        "num_replicas": cfg.replicas,
        "deny_delete": True,
        "deny_purge": True,
        "allow_rollup_hdrs": False,
        "sealed": False,
    }
    events = (
        record_filters(cfg.prefix, catalog.types())
        if cfg.progress_stream
        else [event_filter(cfg.prefix)]
    )
    found = [
        StreamConfig(
            name=cfg.events_stream,
            description="ckpt-ha events: the source of truth (the registry is rebuilt from it)",
            subjects=events,
            max_msg_size=cfg.max_event_bytes,
            **common,
        ),
        StreamConfig(
            name=cfg.dead_letter_stream,
            description="ckpt-ha dead letters: refused events with their reason",
            subjects=[dead_letter_filter(cfg.prefix)],
            **common,
        ),
    ]
    if cfg.progress_stream:
        limits = {
            "max_age": cfg.progress_max_age_s,
            "max_bytes": cfg.progress_max_bytes,
            "max_msgs_per_subject": cfg.progress_per_job,
            # Never longer than the reports are kept (JetStream refuses that).
            "duplicate_window": min(
                cfg.duplicate_window_s, cfg.progress_max_age_s or cfg.duplicate_window_s
            ),
        }
        found.append(
            StreamConfig(
                name=cfg.progress_stream,
                description="ckpt-ha progress and heartbeats: telemetry, kept under limits",
                subjects=telemetry_filters(cfg.prefix),
                max_msg_size=cfg.max_event_bytes,
                **(common | limits),
            )
        )
    return found


_CHECKED = (
    "subjects",
    "storage",
    "retention",
    "max_msgs",
    "max_bytes",
    "max_age",
    "max_msgs_per_subject",
    "max_msg_size",
    "deny_delete",
    "deny_purge",
    "allow_rollup_hdrs",
    "sealed",
)
"""What a service refuses to run without. Replicas and the duplicate window are the operator's
to tune (a wider window only dedupes more); `provision` still sets them. A stream may capture
more subjects than this release needs (a newer release's event types), never fewer."""

_LIMITS = ("max_msgs", "max_bytes", "max_age", "max_msgs_per_subject")
"""Not checked by a service on the progress stream: its limits are the operator's."""


def differences(want: StreamConfig, have: StreamConfig, *, limits: bool = True) -> list[str]:
    """Each checked setting that differs, as ``name is X, needs Y``; without ``limits``, the
    stream's limits are not compared (a service checking the progress stream)."""
    problems = []
    for name in _CHECKED:
        if not limits and name in _LIMITS:
            continue
        need, got = _norm(name, getattr(want, name)), _norm(name, getattr(have, name))
        if name == "subjects":
            missing = sorted(set(need) - set(got))
            if missing:
                problems.append(f"subjects are {got!r}, need {missing!r} too")
        elif need != got:
            problems.append(f"{name} is {got!r}, needs {need!r}")
    if (have.num_replicas or 1) < (want.num_replicas or 1):
        problems.append(f"num_replicas is {have.num_replicas}, needs {want.num_replicas}")
    return problems


def _norm(name: str, value: Any) -> Any:
    """Server and client spell 'unset' differently (None, 0, -1, False)."""
    if name in ("max_msgs", "max_bytes", "max_msgs_per_subject", "max_msg_size"):
        return -1 if value in (None, 0, -1) else value
    if name == "max_age":
        return 0 if value in (None, 0) else value
    if name in ("deny_delete", "deny_purge", "allow_rollup_hdrs", "sealed"):
        return bool(value)
    if name == "subjects":
        return sorted(value or [])
    if hasattr(value, "value"):
        return value.value
    return value


async def check(js: JetStreamContext, cfg: BusConfig) -> None:
    """Raise `StreamMisconfigured` unless every stream exists as `desired` says. Reads only."""
    for want in desired(cfg):
        assert want.name is not None
        try:
            info = await js.stream_info(want.name)
        except NotFoundError:
            raise StreamMisconfigured(want.name, ["it does not exist"]) from None
        problems = differences(want, info.config, limits=want.name != cfg.progress_stream)
        if problems:
            raise StreamMisconfigured(want.name, problems)


async def provision(js: JetStreamContext, cfg: BusConfig) -> list[str]:
    """Create the streams, or bring existing ones to `desired` (operator only). Returns what it
    did, one line per stream. Never purges or deletes: an existing stream keeps its events."""
    done = []
    for want in desired(cfg):
        assert want.name is not None
        try:
            info = await js.stream_info(want.name)
        except NotFoundError:
            await js.add_stream(want)
            done.append(f"{want.name}: created")
            continue
        problems = differences(want, info.config)
        if not problems:
            done.append(f"{want.name}: as required")
            continue
        await js.update_stream(want)
        done.append(f"{want.name}: updated ({'; '.join(problems)})")
    return done


async def identity(js: JetStreamContext, cfg: BusConfig) -> str:
    """Which event stream this is: its name and when it was created. A stream deleted and
    created again under the same name (its history gone) has another identity, though it starts
    at sequence 1 like the original."""
    info = await js.stream_info(cfg.events_stream)
    created = info.created.isoformat() if info.created is not None else "unknown"
    return f"{cfg.events_stream}@{created}"


async def require_complete(js: JetStreamContext, cfg: BusConfig) -> None:
    """Raise `StreamTruncated` when the event stream lost events at its start (a purge, or a
    limit that dropped old messages): what a rebuild replays must be the whole history."""
    info = await js.stream_info(cfg.events_stream)
    first = info.state.first_seq
    if first > 1:
        raise StreamTruncated(cfg.events_stream, first, info.state.messages)
