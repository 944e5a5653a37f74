"""`ckpt-ha checkpoint ...`: one checkpoint or a job's checkpoints.

- `list`, `show`: the registry's view of a job's checkpoints, or of one with its history.
- `verify`, `latest-valid`: a verdict from the files alone, no NATS, Redis or services. They need
  only the base install (no `server` extra), so a training image or a laptop with the light SDK
  can still check a checkpoint folder: what they import is nothing server-side. Both take a local
  path or an `s3://bucket/prefix` URI (boto3 is then needed: the `s3` extra).
- `quarantine`, `release`, `pin`, `unpin`: manual actions on one checkpoint, each recorded with
  its actor and reason (see `ckpt_ha.ops.checkpoints`).

The old spellings `checkpoints list|show`, `verify`, `latest-valid`, `quarantine`, `release`, `pin`
and `unpin` keep working.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, progress, render
from ckpt_ha.cli.arguments import ACTOR_HELP, Parser, add_json, add_progress, text
from ckpt_ha.cli.errors import Exit
from ckpt_ha.contracts.checkpoint import CheckpointState

if TYPE_CHECKING:
    from ckpt_ha.core.records import CheckpointRecord
    from ckpt_ha.registry.redis_registry import Registry
    from ckpt_ha.runtime.settings import ServiceSettings

    Act = Callable[[Registry, context.LazyPublisher, datetime], Awaitable[CheckpointRecord]]


def register(top: Parser) -> None:
    ck = top.command("checkpoint", help="one checkpoint or a job's checkpoints")
    top.alias("checkpoints", ck)
    ls = ck.command("list", help="a job's checkpoints, newest step first", handler=cmd_list)
    ls.add_argument("--job", required=True)
    ls.add_argument("--state", choices=[s.value for s in CheckpointState])
    add_json(ls)
    show = ck.command("show", help="one checkpoint with its history", handler=cmd_show)
    show.add_argument("checkpoint_id")
    add_json(show)
    _register_offline(top, ck)
    _register_manual(top, ck)


def _register_offline(top: Parser, ck: Parser) -> None:
    vf = ck.command(
        "verify",
        help="offline verdict for one checkpoint folder or file (exit 0 only if valid)",
        handler=cmd_verify,
    )
    vf.add_argument("path", help="a local folder or file, or s3://bucket/prefix")
    add_json(vf)
    add_progress(vf)
    vf.add_argument("--checksum", choices=["xxh3_64", "sha256"], default="xxh3_64")
    lv = ck.command(
        "latest-valid",
        help="the newest valid checkpoint under a run's root, and why newer failed",
        handler=cmd_latest_valid,
    )
    lv.add_argument("root", help="a local directory, or s3://bucket/prefix")
    add_json(lv)
    add_progress(lv)
    top.alias("verify", vf)
    top.alias("latest-valid", lv)


def _register_manual(top: Parser, ck: Parser) -> None:
    qu = ck.command(
        "quarantine",
        help="take a checkpoint out of restore candidates by hand",
        handler=cmd_quarantine,
    )
    rl = ck.command(
        "release",
        help="after a human check: verify a quarantined checkpoint again",
        handler=cmd_release,
    )
    for p in (qu, rl):
        p.add_argument("checkpoint_id")
        p.add_argument("--reason", required=True, type=text)
        p.add_argument("--actor", type=text, help=ACTOR_HELP)
        add_json(p)
    pn = ck.command(
        "pin",
        help="keep a checkpoint for an evaluation or candidate model (retention honours it)",
        handler=cmd_pin,
    )
    pn.add_argument("checkpoint_id")
    pn.add_argument("--by", required=True, type=text, help="who holds it, e.g. eval:mmlu")
    pn.add_argument("--reason", type=text, help="default: held by the --by name")
    un = ck.command(
        "unpin",
        help="release a pin (retention may then expire the checkpoint)",
        handler=cmd_unpin,
    )
    un.add_argument("checkpoint_id")
    un.add_argument("--by", required=True, type=text)
    un.add_argument("--reason", type=text, help="default: released by the --by name")
    for p in (pn, un):
        p.add_argument("--actor", type=text, help=ACTOR_HELP)
        add_json(p)
    for old, parser in (("quarantine", qu), ("release", rl), ("pin", pn), ("unpin", un)):
        top.alias(old, parser)


def cmd_list(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.contracts.checkpoint import CheckpointState
    from ckpt_ha.ops import checkpoints

    settings = context.settings(env, home)

    async def query() -> checkpoints.JobCheckpoints:
        async with context.registry(settings) as registry:
            state = CheckpointState(args.state) if args.state else None
            return await checkpoints.of_job(registry, args.job, state)

    found = context.run(settings, query)
    tier = found.tier
    if args.json:
        docs = [{**r.model_dump(mode="json"), "tier": tier.tier.name} for r in found.records]
        print(render.dumps(docs))
    elif not found.records:
        print(f"no checkpoints registered for job {args.job}")
    else:
        print(
            f"job {args.job}, owned by {found.owner or 'no project'},"
            f" tier {tier.tier.name} ({tier.source}: {tier.detail})"
        )
        print(render.record_rows(found.records, tier.tier.name))
    return 0


def cmd_show(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import checkpoints

    settings = context.settings(env, home)

    async def query() -> checkpoints.CheckpointView:
        async with context.registry(settings) as registry:
            return await checkpoints.show(registry, args.checkpoint_id)

    view = context.run(settings, query)
    record, tier = view.record, view.tier
    if args.json:
        print(record.model_dump_json(indent=2))
        return 0
    print(render.record_rows([record], tier.tier.name))
    print(f"tier: {tier.tier.name} ({tier.source}: {tier.detail})")
    for p in record.pins:
        print(f"pinned by {p.by} ({p.actor}, {p.at.isoformat()}): {p.reason}")
    if record.expiry is not None:
        e = record.expiry
        grace = e.grace_until.isoformat() if e.grace_until else "-"
        print(f"expired by {e.actor} under {e.policy}; grace until {grace}: {e.reason}")
    if record.tombstone is not None:
        t = record.tombstone
        print(f"deleted by {t.actor} at {t.at.isoformat()}; see `ckpt-ha audit --checkpoint ID`")
    if record.identity is not None:
        ident = record.identity.model_dump(mode="json", exclude_none=True)
        print("identity: " + json.dumps(ident, sort_keys=True))
    if record.quarantine_uri:
        print(f"quarantined bytes at: {record.quarantine_uri}")
    for c in sorted(record.copies.values(), key=lambda c: c.uri):
        since = f"; last valid {c.valid_since.isoformat()}" if c.valid_since else ""
        why = f": {c.reason}" if c.reason else ""
        print(f"copy {c.uri}: {c.state.value} since {c.at.isoformat()}{since}{why}")
    print()
    print(
        render.table(
            ["AT", "STATE", "EVENT", "ACTOR", "REASON"],
            [
                (h.at.isoformat(), h.state.value, h.event_type, h.actor, h.reason or "")
                for h in record.history
            ],
        )
    )
    return 0


def cmd_verify(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Exit 0 valid, 1 anything else; a location that holds nothing is a usage error (2), S3
    that cannot be read an unreachable dependency (3)."""
    from ckpt_ha.ops.offline import NothingThere, verify_location
    from ckpt_ha.storage import NeedsS3Extra, StorageError

    try:
        with progress.reporting(args, f"verify {args.path}", "bytes") as tick:
            report = verify_location(args.path, args.checksum, tick)
    except (NothingThere, StorageError, NeedsS3Extra) as exc:
        print(f"ckpt-ha: {_one_line(exc, args.path)}", file=sys.stderr)
        return _offline_exit(exc)
    if args.json:
        print(render.dumps(report.to_json()))
    else:
        step = "-" if report.step is None else report.step
        verdict, fmt = report.verdict.value.upper(), report.format.value
        print(f"{verdict}  {args.path}  format={fmt}  step={step}")
        for reason in report.reasons:
            print(f"  - {reason}")
        for note in report.notes:
            print(f"  note: {note}")
        if report.ok:
            print(f"  checks: {', '.join(report.checks)}; {report.bytes_read} bytes read")
    return 0 if report.ok else 1


def cmd_latest_valid(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Exit 0 when a valid checkpoint exists, 1 when none does, 2 for a missing root, 3 for S3
    that cannot be read."""
    from ckpt_ha.ops.offline import NothingThere, newest_valid
    from ckpt_ha.storage import NeedsS3Extra, StorageError

    try:
        with progress.reporting(args, f"latest-valid {args.root}", "folders checked") as tick:
            found = newest_valid(args.root, tick)
    except (NothingThere, StorageError, NeedsS3Extra) as exc:
        print(f"ckpt-ha: {_one_line(exc, args.root)}", file=sys.stderr)
        return _offline_exit(exc)
    if args.json:
        doc = {
            "path": found.path,
            "step": found.report.step if found.report else None,
            "format": found.report.format.value if found.report else None,
            "rejected": [r.to_json() for r in found.rejected],
        }
        print(render.dumps(doc))
    else:
        for r in found.rejected:
            why = r.report.reasons[0] if r.report.reasons else ""
            print(f"rejected  {r.path}  step={r.report.step}  {r.report.verdict.value}: {why}")
        if found.report is not None:
            weights_only = "  (weights only: not an exact resume)"
            label = weights_only if found.report.exact_resume is False else ""
            print(f"LATEST VALID  {found.path}  step={found.report.step}{label}")
        else:
            print(f"no valid checkpoint under {args.root}")
    return 0 if found.path is not None else 1


def _offline_exit(exc: Exception) -> Exit:
    """Storage that cannot be read (down, access denied, no such bucket) is an unreachable
    dependency (3); a location that holds nothing or cannot be a key is a usage error (2)."""
    from ckpt_ha.storage import StorageError
    from ckpt_ha.storage.errors import InvalidKey

    unreadable = isinstance(exc, StorageError) and not isinstance(exc, InvalidKey)
    return Exit.UNREACHABLE if unreadable else Exit.USAGE


def _one_line(exc: Exception, location: str) -> str:
    text = " ".join(str(exc).split())
    return text if text.startswith(location) else f"{location}: {text}"


def _manual(settings: ServiceSettings, args: argparse.Namespace, act: Act) -> int:
    async def run() -> CheckpointRecord:
        async with context.registry(settings) as registry, context.publisher(settings) as pub:
            return await act(registry, pub, datetime.now(UTC))

    record = context.run(settings, run)
    if args.json:
        print(record.model_dump_json(indent=2))
    else:
        print(render.transition(record))
    return 0


def cmd_quarantine(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import checkpoints as ops

    settings, actor = context.settings(env, home), context.actor(args, env)
    return _manual(
        settings,
        args,
        lambda reg, pub, now: ops.quarantine(
            reg, pub, args.checkpoint_id, reason=args.reason, actor=actor, now=now
        ),
    )


def cmd_release(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import checkpoints as ops

    settings, actor = context.settings(env, home), context.actor(args, env)
    code = _manual(
        settings,
        args,
        lambda reg, pub, now: ops.release(
            reg, pub, args.checkpoint_id, reason=args.reason, actor=actor, now=now
        ),
    )
    if not args.json:
        print("it is verified again and becomes valid only if the integrity checks pass")
    return code


def cmd_pin(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import checkpoints as ops

    settings, actor = context.settings(env, home), context.actor(args, env)
    reason = args.reason or f"held by {args.by}"
    return _manual(
        settings,
        args,
        lambda reg, pub, now: ops.pin(
            reg, pub, args.checkpoint_id, by=args.by, reason=reason, actor=actor, now=now
        ),
    )


def cmd_unpin(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import checkpoints as ops

    settings, actor = context.settings(env, home), context.actor(args, env)
    reason = args.reason or f"released by {args.by}"
    return _manual(
        settings,
        args,
        lambda reg, pub, now: ops.unpin(
            reg, pub, args.checkpoint_id, by=args.by, reason=reason, actor=actor, now=now
        ),
    )
