"""Who may publish and consume what on NATS, rendered into ``deploy/nats/``.

Each service declares what it publishes and consumes in its own ``access.py`` (a `Principal`);
the scheduler side, training processes and the operator are declared here.
``python -m ckpt_ha.bus.permissions [--check]`` writes ``deploy/nats/permissions.conf``; a test
fails when the committed file and these declarations drift, and another runs the services under
their rendered users against a real nats-server. Each service may publish only the events it owns
(the restore-coordinator also ``job.failed``, for an attempt it declares lost), consume only
through its own durable consumers, and dead-letter only under its own name.
Passwords are never in the file: each is read from ``$CKPT_HA_NATS_PASSWORD_<USER>``.

Streams are the operator's: only ``operator`` may create or update them (``ckpt-ha streams
provision``); services and jobs may only read a stream's configuration, and nobody may purge or
delete a stream or its messages through this config. The ``viewer`` (on-call triage, ``ckpt-ha
status``) reads: stream and consumer state and stored messages (``dead-letters``), nothing else; it
publishes no event and creates, changes or deletes no consumer. A training process connects as
``job``: it may publish only the events a job says about itself, each signed with its own job's key
(`ckpt_ha.contracts.signing`), and subscribes to nothing but its replies: it never sees another
job's events. Replies (publish acks, API answers, and the events a pull consumer fetches) arrive
under each user's own inbox prefix, ``_INBOX_<user>`` (`ckpt_ha.contracts.subjects.inbox_prefix`,
which every client connects with), and a user may subscribe under its own prefix only, never under
another's or under NATS's shared ``_INBOX``. The scheduler side (``runner``) watches its jobs'
plans. The ``operator`` may publish any event: its acts by hand, and the replay of a dead letter
(`OPERATOR_PUBLISHES`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ckpt_ha.assets import asset, write_or_check
from ckpt_ha.bus.access import Principal
from ckpt_ha.contracts.subjects import (
    DEAD_LETTERS,
    DEFAULT_PREFIX,
    EVENTS,
    REPLAYED,
    inbox_prefix,
)
from ckpt_ha.integrity_checker import access as integrity_checker
from ckpt_ha.registrar import access as registrar
from ckpt_ha.restore_coordinator import access as restore_coordinator
from ckpt_ha.retention_janitor import access as retention_janitor
from ckpt_ha.writer_watcher import access as writer_watcher

CONF = asset("nats", "permissions.conf")
"""Shipped as package data; in a checkout it is ``deploy/nats/permissions.conf``."""
EVENTS_STREAM = "CKPT_EVENTS"
DLQ_STREAM = "CKPT_DLQ"
PROGRESS_STREAM = "CKPT_PROGRESS"


PRINCIPALS: tuple[Principal, ...] = (
    writer_watcher.NATS,
    integrity_checker.NATS,
    registrar.NATS,
    restore_coordinator.NATS,
    retention_janitor.NATS,
    # Scheduler adapters (`ckpt-ha run`, Slurm, Kubernetes): the job lifecycle and its plans.
    Principal("runner", ("job.started", "job.heartbeat", "job.progress", "job.failed",
                         "job.succeeded", "resume.loaded", "resume.load_failed"),
              watches=("resume.planned", "resume.escalated", "job.stop_requested"),
              reads_messages=True),
    # Training processes (the SDK): what a job says about itself, signed with its job's key.
    Principal("job", ("job.progress", "resume.loaded", "resume.load_failed",
                      "checkpoint.writing", "checkpoint.committed")),
)  # fmt: skip

OPERATOR = "operator"
OPERATOR_PUBLISHES = ("{prefix}.{events}.>", "{prefix}.{dlq}.{replayed}.>")
"""Every event subject, and the replay markers of the dead-letter stream. The operator's own acts
through the CLI (quarantine, release, pin, unpin, tier and ownership choices, `ckpt-ha demo`'s
commit signed like a job's own) are each recorded with its actor; ``ckpt-ha dead-letters
replay`` re-publishes a dead letter's original bytes on its original subject, whatever event it
is (a job's events keep their job's signature, which admission still checks), and records each
replay under ``<prefix>.dlq.replayed.<seq>``."""


VIEWER = "viewer"
"""Read-only: on-call triage from a context or the toolbox (`ckpt-ha status`, `dead-letters`)."""


def users() -> tuple[str, ...]:
    """Every NATS user of a deployment: the principals, the operator and the viewer."""
    return (*(p.user for p in PRINCIPALS), OPERATOR, VIEWER)


def env_password(user: str) -> str:
    return "$CKPT_HA_NATS_PASSWORD_" + user.upper().replace("-", "_")


def _q(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def render(
    password: Callable[[str], str] = env_password,
    prefix: str = DEFAULT_PREFIX,
    events_stream: str = EVENTS_STREAM,
    dlq_stream: str = DLQ_STREAM,
    progress_stream: str = PROGRESS_STREAM,
) -> str:
    """``progress_stream`` empty: telemetry stays in the event stream, its durables too."""
    streams = [events_stream, dlq_stream, *([progress_stream] if progress_stream else [])]
    progress_stream = progress_stream or events_stream
    # Read-only: services check the streams at start and never change them.
    common_pub = ["$JS.API.INFO", *(f"$JS.API.STREAM.INFO.{s}" for s in streams)]
    lines = [
        "# Generated by `python -m ckpt_ha.bus.permissions`; edit the table there, not here.",
        "# Passwords come from the environment: CKPT_HA_NATS_PASSWORD_<USER>.",
        "authorization {",
        "  users = [",
    ]
    for p in PRINCIPALS:
        pub = [f"{prefix}.{EVENTS}.{t}.*.*" for t in p.publishes] + common_pub
        sub = [f"{inbox_prefix(p.user)}.>", *(f"{prefix}.{EVENTS}.{t}.*.*" for t in p.watches)]
        durables = list(p.durable_streams(events_stream, progress_stream).items())
        # Before `ckpt-ha streams provision` moves the reports (docs/UPGRADES.md), a release
        # configured without a progress stream consumes them from the event stream.
        durables += [(d, events_stream) for d, s in durables if s != events_stream]
        for durable, stream in durables:
            pub += [
                f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
                f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
                f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
                f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
                f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
                f"$JS.ACK.{stream}.{durable}.>",
            ]
            sub.append(f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{durable}")
        if p.consumers or p.reads_messages:
            pub.append(f"$JS.API.STREAM.MSG.GET.{events_stream}")
        if p.reports and progress_stream != events_stream:
            pub.append(f"$JS.API.STREAM.MSG.GET.{progress_stream}")
        if p.consumers:
            pub.append(f"{prefix}.{DEAD_LETTERS}.{p.user}.>")
        lines += [
            "    {",
            f'      user: "{p.user}"',
            f"      password: {password(p.user)}",
            "      permissions: {",
            f"        publish: {{ allow: {_q(pub)} }}",
            f"        subscribe: {{ allow: {_q(sub)} }}",
            "      }",
            "    }",
        ]
    names = {"prefix": prefix, "events": EVENTS, "dlq": DEAD_LETTERS, "replayed": REPLAYED}
    operator_pub = [
        *(p.format(**names) for p in OPERATOR_PUBLISHES),
        "$JS.API.INFO",
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.LIST",
        # Provisioning: create and change the streams; never PURGE or DELETE (nor MSG.DELETE).
        *(f"$JS.API.STREAM.{op}.{s}" for s in streams for op in ("INFO", "CREATE", "UPDATE")),
        *(f"$JS.API.STREAM.MSG.GET.{s}" for s in streams),
        # Reading the streams back (rebuild, audits, dead letters): ephemeral consumers, pushed
        # (ordered) or pulled a batch at a time.
        *(f"$JS.API.CONSUMER.CREATE.{s}" for s in streams),
        *(f"$JS.API.CONSUMER.CREATE.{s}.>" for s in streams),
        *(f"$JS.API.CONSUMER.INFO.{s}.*" for s in streams),
        *(f"$JS.API.CONSUMER.DELETE.{s}.*" for s in streams),
        *(f"$JS.API.CONSUMER.LIST.{s}" for s in streams),
        *(f"$JS.API.CONSUMER.MSG.NEXT.{s}.*" for s in streams),
        *(f"$JS.FC.{s}.>" for s in streams),
    ]
    lines += [
        "    # Operators: the ckpt-ha CLI (provisioning, rebuild, audits, manual acts).",
        "    {",
        f'      user: "{OPERATOR}"',
        f"      password: {password(OPERATOR)}",
        "      permissions: {",
        f"        publish: {{ allow: {_q(operator_pub)} }}",
        f"        subscribe: {{ allow: {_q([f'{inbox_prefix(OPERATOR)}.>', f'{prefix}.>'])} }}",
        "      }",
        "    }",
    ]
    viewer_pub = [
        "$JS.API.INFO",
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.LIST",
        *(f"$JS.API.STREAM.INFO.{s}" for s in streams),
        *(f"$JS.API.STREAM.MSG.GET.{s}" for s in streams),
        *(f"$JS.API.CONSUMER.INFO.{s}.*" for s in streams),
        *(f"$JS.API.CONSUMER.LIST.{s}" for s in streams),
        *(f"$JS.API.CONSUMER.NAMES.{s}" for s in streams),
    ]
    lines += [
        "    # On-call triage: reads stream and consumer state and stored messages; nothing else.",
        "    {",
        f'      user: "{VIEWER}"',
        f"      password: {password(VIEWER)}",
        "      permissions: {",
        f"        publish: {{ allow: {_q(viewer_pub)} }}",
        f"        subscribe: {{ allow: {_q([f'{inbox_prefix(VIEWER)}.>'])} }}",
        "      }",
        "    }",
        "  ]",
        "}",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    return write_or_check(CONF, render(), "ckpt_ha/bus/permissions.py", check=check)


if __name__ == "__main__":
    raise SystemExit(main())
