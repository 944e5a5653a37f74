"""Durable consumers that provisioning made obsolete, listed and then removed (operator only).

When `ckpt_ha.bus.streams.provision` narrows a stream (the event stream giving its telemetry
subjects to the progress stream), ckpt-ha's durables on the subjects it gave up stay on it:
they can never be delivered a new message, yet they keep their state on every server until
someone removes them. A durable is obsolete when it is one of ckpt-ha's (named
``<user>--<consumer>`` after a NATS user of `ckpt_ha.bus.permissions`) and its filter no longer
overlaps any subject its stream captures. It is listed on every provisioning, and removed once
nothing was delivered through it for the grace period, so a replica of the earlier release
still draining it during a rollout is never cut off mid-batch. What it delivered and never saw
acknowledged (a replica stopped mid-batch) is said, not waited for: only it could take those,
and it is not coming back.
Anyone else's consumer on the streams is never touched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from nats.js.api import ConsumerInfo
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from ckpt_ha.bus.config import BusConfig


def overlap(a: str, b: str) -> bool:
    """Whether two NATS subjects (with ``*`` and ``>`` wildcards) can match a common subject."""
    x, y = a.split("."), b.split(".")
    for i in range(max(len(x), len(y))):
        s = x[i] if i < len(x) else None
        t = y[i] if i < len(y) else None
        if s == ">" or t == ">":
            return s is not None and t is not None
        if s is None or t is None:
            return False
        if s != t and "*" not in (s, t):
            return False
    return True


@dataclass(frozen=True)
class Obsolete:
    """One of ckpt-ha's durables its stream no longer feeds."""

    stream: str
    durable: str
    filters: tuple[str, ...]
    idle_since: datetime
    """Its last delivery, or its creation if it never delivered."""
    ack_pending: int

    def idle_s(self, now: datetime) -> float:
        return (now - self.idle_since).total_seconds()


def _filters(info: ConsumerInfo) -> tuple[str, ...]:
    cfg = info.config
    return tuple(cfg.filter_subjects or ([cfg.filter_subject] if cfg.filter_subject else []))


async def find(js: JetStreamContext, cfg: BusConfig, owners: Iterable[str]) -> list[Obsolete]:
    """ckpt-ha's durables (named after one of ``owners``) on the streams of ``cfg`` whose
    filters no longer overlap any subject of their stream. Reads only."""
    prefixes = tuple(f"{o}--" for o in owners)
    found = []
    for stream in (cfg.events_stream, cfg.dead_letter_stream, cfg.progress_stream):
        if not stream:
            continue
        try:
            captured = (await js.stream_info(stream)).config.subjects or []
        except NotFoundError:
            continue
        for info in await js.consumers_info(stream):
            filters = _filters(info)
            if not info.name.startswith(prefixes) or not filters:
                continue
            if any(overlap(f, s) for f in filters for s in captured):
                continue
            delivered = info.delivered.last_active if info.delivered else None
            found.append(
                Obsolete(
                    stream, info.name, filters, delivered or info.created, info.num_ack_pending or 0
                )
            )
    return found


async def retire(
    js: JetStreamContext,
    cfg: BusConfig,
    owners: Iterable[str],
    *,
    grace_s: float,
    now: datetime,
) -> list[str]:
    """List the obsolete durables (`find`) and remove those idle for ``grace_s``; one line
    each saying which and what was done."""
    done = []
    for o in await find(js, cfg, owners):
        what = f"{o.stream}: consumer {o.durable} on {', '.join(o.filters)} is obsolete"
        idle = o.idle_s(now)
        pending = f", {o.ack_pending} delivered never acked" if o.ack_pending else ""
        if idle >= grace_s:
            await js.delete_consumer(o.stream, o.durable)
            done.append(f"{what} (idle {idle:.0f}s{pending}): removed")
        else:
            done.append(
                f"{what} (idle {idle:.0f}s{pending}): kept until idle for {grace_s:.0f}s; "
                "a later `streams provision` removes it"
            )
    return done
