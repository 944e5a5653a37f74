"""Dead-lettered messages: why they were refused (``ckpt-ha dead-letters``) and, once the cause
is fixed, their replay (``ckpt-ha dead-letters replay``).

A replay re-publishes a dead letter's original bytes with its original headers (a job's
signature among them, so admission accepts it as it would have the first time) on its original
subject. Every consumer of that subject sees it again; each is idempotent by event id, so the
ones that had handled it change nothing, and the one that had refused it handles it now.

Replaying twice publishes each dead letter once. The streams refuse deletes, so what was
replayed is recorded next to the dead letters: after re-publishing, one marker per dead letter
on ``<prefix>.dlq.replayed.<seq>`` (`ckpt_ha.contracts.subjects.replay_marker_subject`), naming
the event-stream sequence it was replayed as, the actor and the time. A replay skips every dead
letter with a marker. The re-publish goes first: a replay interrupted between the two repeats
the re-publish next time, which JetStream drops within its duplicate window (the ``Nats-Msg-Id``
is the refused message's own sequence) and consumers ignore after it; the other order could
lose the replay. Dead letters of one message by several consumers are re-published once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from ckpt_ha.bus import letters
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts.subjects import DEAD_LETTERS, REPLAYED, replay_marker_subject


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    consumer: str | None
    code: str | None
    deliveries: str | None
    subject: str | None
    error: str | None
    bytes: int
    replayed_as: int | None = None
    """The event-stream sequence a replay re-published it as (None: never replayed)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _is_marker(subject: str | None) -> bool:
    tokens = (subject or "").split(".")
    return len(tokens) == 4 and tokens[1:3] == [DEAD_LETTERS, REPLAYED]


def _letter(seq: int, subject: str | None, headers: Mapping[str, str], size: int) -> DeadLetter:
    return DeadLetter(
        seq=seq,
        consumer=headers.get(letters.CONSUMER),
        code=headers.get(letters.ERROR_CODE),
        deliveries=headers.get(letters.DELIVERY_COUNT),
        subject=headers.get(letters.ORIGINAL_SUBJECT),
        error=headers.get(letters.ERROR),
        bytes=size,
    )


def _replayed(headers: Mapping[str, str]) -> tuple[int, int] | None:
    """(dead letter seq, replayed-as seq) of a replay marker."""
    try:
        return int(headers[letters.REPLAY_OF]), int(headers[letters.REPLAYED_AS])
    except (KeyError, ValueError):
        return None


async def newest(js: JetStreamContext, stream: str, limit: int) -> list[DeadLetter]:
    """The last ``limit`` dead letters, oldest first, each with its replay if it had one; none
    when the stream does not exist. Read backwards: a replay marker always follows its letter."""
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return []
    out: list[DeadLetter] = []
    replays: dict[int, int] = {}
    seq = info.state.last_seq if info.state.messages else 0
    while seq >= info.state.first_seq and seq > 0 and len(out) < limit:
        try:
            msg = await js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            seq -= 1
            continue
        h = msg.headers or {}
        if _is_marker(msg.subject):
            if (pair := _replayed(h)) is not None:
                replays[pair[0]] = pair[1]
        else:
            letter = _letter(seq, msg.subject, h, len(msg.data or b""))
            out.append(_with_replay(letter, replays[seq]) if seq in replays else letter)
        seq -= 1
    return out[::-1]


@dataclass(frozen=True)
class Selection:
    """Which dead letters a replay takes: each given criterion must match."""

    code: str | None = None
    since: datetime | None = None
    """Dead-lettered at or after this time."""
    consumer: str | None = None
    """The durable consumer that refused it (``registrar--checkpoints``)."""


@dataclass(frozen=True)
class _Stored:
    """A dead letter as stored: what a replay needs to re-publish it."""

    letter: DeadLetter
    data: bytes
    headers: dict[str, str]
    original_seq: int | None


@dataclass
class ReplayReport:
    replayed: list[DeadLetter] = field(default_factory=list)
    """Dead letters re-published now, each with the event-stream sequence it became."""
    already: list[DeadLetter] = field(default_factory=list)
    """Selected, but replayed before (each with what it was replayed as)."""
    never: list[DeadLetter] = field(default_factory=list)
    """Selected, but refusals of who may say what (`letters.NEVER_REPLAYED`), or without an
    original subject to publish on: left alone."""
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "replayed": [d.to_json() for d in self.replayed],
            "already_replayed": [d.to_json() for d in self.already],
            "never_replayed": [d.to_json() for d in self.never],
        }


async def _read(
    js: JetStreamContext, cfg: BusConfig, since: datetime | None, idle_timeout: float
) -> tuple[list[_Stored], dict[int, int]]:
    """Every dead letter (from ``since``) and every replay marker: letter seq → replayed as."""
    stored: list[_Stored] = []
    replays: dict[int, int] = {}
    try:
        info = await js.stream_info(cfg.dead_letter_stream)
    except nats.js.errors.NotFoundError:
        return stored, replays
    if info.state.messages == 0:
        return stored, replays
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    if since is not None:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=since)
    sub = await js.subscribe(
        f"{cfg.prefix}.{DEAD_LETTERS}.>",
        stream=cfg.dead_letter_stream,
        ordered_consumer=True,
        config=config,
    )
    try:
        while True:
            try:
                msg: Msg = await sub.next_msg(timeout=idle_timeout)
            except TimeoutError:
                break  # nothing (more) since then
            _take(msg, stored, replays)
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return stored, replays


def _take(msg: Msg, stored: list[_Stored], replays: dict[int, int]) -> None:
    h = dict(msg.headers or {})
    if _is_marker(msg.subject):
        if (pair := _replayed(h)) is not None:
            replays[pair[0]] = pair[1]
        return
    seq = msg.metadata.sequence.stream
    try:
        original_seq: int | None = int(h.get(letters.STREAM_SEQ, ""))
    except ValueError:
        original_seq = None
    stored.append(
        _Stored(_letter(seq, msg.subject, h, len(msg.data or b"")), msg.data, h, original_seq)
    )


def _selected(letter: DeadLetter, selection: Selection) -> bool:
    return (selection.code is None or letter.code == selection.code) and (
        selection.consumer is None or letter.consumer == selection.consumer
    )


def _groups(stored: Iterable[_Stored]) -> list[list[_Stored]]:
    """Dead letters of one refused message (several consumers refused it) together, in order."""
    groups: dict[object, list[_Stored]] = {}
    for s in stored:
        key = s.original_seq if s.original_seq is not None else ("dlq", s.letter.seq)
        groups.setdefault(key, []).append(s)
    return list(groups.values())


async def replay(
    js: JetStreamContext,
    cfg: BusConfig,
    selection: Selection,
    *,
    actor: str,
    now: datetime,
    dry_run: bool = False,
    idle_timeout: float = 2.0,
) -> ReplayReport:
    """Re-publish every selected dead letter not replayed before, once, and record each."""
    stored, replays = await _read(js, cfg, selection.since, idle_timeout)
    report = ReplayReport(dry_run=dry_run)
    todo: list[_Stored] = []
    for s in stored:
        if not _selected(s.letter, selection):
            continue
        if s.letter.seq in replays:
            report.already.append(_with_replay(s.letter, replays[s.letter.seq]))
        elif s.letter.code in letters.NEVER_REPLAYED or not s.letter.subject:
            report.never.append(s.letter)
        else:
            todo.append(s)
    for group in _groups(todo):
        if dry_run:
            report.replayed += [g.letter for g in group]
            continue
        as_seq = await _republish(js, cfg, group[0])
        for g in group:
            await _mark(js, cfg, g.letter.seq, as_seq, actor=actor, now=now)
            report.replayed.append(_with_replay(g.letter, as_seq))
    return report


def _with_replay(letter: DeadLetter, as_seq: int) -> DeadLetter:
    return DeadLetter(**{**asdict(letter), "replayed_as": as_seq})


async def _republish(js: JetStreamContext, cfg: BusConfig, s: _Stored) -> int:
    """The original bytes and headers on the original subject; the event-stream sequence."""
    assert s.letter.subject is not None
    headers = letters.original_headers(s.headers)
    source = s.original_seq if s.original_seq is not None else f"dlq{s.letter.seq}"
    headers["Nats-Msg-Id"] = f"replay:{cfg.stream_of(s.letter.subject)}:{source}"
    headers[letters.REPLAYED_FROM] = f"{cfg.dead_letter_stream}:{s.letter.seq}"
    ack = await js.publish(
        s.letter.subject,
        s.data,
        headers=headers,
        stream=cfg.stream_of(s.letter.subject),
        timeout=5.0,
    )
    return ack.seq


async def _mark(
    js: JetStreamContext, cfg: BusConfig, seq: int, as_seq: int, *, actor: str, now: datetime
) -> None:
    body = {"dead_letter_seq": seq, "replayed_as": as_seq, "actor": actor, "at": now.isoformat()}
    await js.publish(
        replay_marker_subject(cfg.prefix, seq),
        json.dumps(body).encode(),
        headers={
            "Nats-Msg-Id": f"replayed:{cfg.dead_letter_stream}:{seq}",
            letters.REPLAY_OF: str(seq),
            letters.REPLAYED_AS: str(as_seq),
        },
        stream=cfg.dead_letter_stream,
        timeout=5.0,
    )
