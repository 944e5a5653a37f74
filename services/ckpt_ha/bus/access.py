"""What a NATS user may publish and consume: the declaration each service makes in its own
``access.py`` (`Principal`), from which `ckpt_ha.bus.permissions` renders
``deploy/nats/permissions.conf``.

A declaration names event types and consumers only; the subjects, the JetStream API calls they
need and the dead-letter subjects are the renderer's (one format for every user).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    user: str
    publishes: tuple[str, ...]
    """Event types (``checkpoint.committed``) this principal is the source of."""
    consumers: tuple[str, ...] = ()
    """Its durable consumers on the event stream (named ``<user>--<consumer>``). NATS has no
    partial-token wildcards, so every consumer is listed; a test checks this against the apps."""
    reports: tuple[str, ...] = ()
    """Its durable consumers on the progress stream (``job.progress``, ``job.heartbeat``)."""
    watches: tuple[str, ...] = ()
    """Event types it follows live with a plain subscription (no durable consumer): the
    runner waits for its job's ``resume.planned`` / ``resume.escalated`` this way."""
    reads_messages: bool = False
    """May read single stored messages of the event stream (``STREAM.MSG.GET``): the runner
    looks up the last plan of its job when it takes over a lost run (``ckpt-ha run
    --resume``), which may have been published before it subscribed."""

    def durables(self) -> list[str]:
        return [f"{self.user}--{c}" for c in (*self.consumers, *self.reports)]

    def durable_streams(self, events: str, progress: str) -> dict[str, str]:
        """Each durable and the stream it is on."""
        on_events = {f"{self.user}--{c}": events for c in self.consumers}
        return on_events | {f"{self.user}--{c}": progress for c in self.reports}
