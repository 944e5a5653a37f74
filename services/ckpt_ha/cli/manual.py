"""`ckpt-ha quarantine|release|pin|unpin CHECKPOINT`: manual actions on one checkpoint, each
recorded with its actor and reason (see `ckpt_ha.ops.checkpoints`)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from ckpt_ha.cli import context, render
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.ops import checkpoints
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings

Act = Callable[[Registry, context.LazyPublisher, datetime], Awaitable[CheckpointRecord]]


def _act(settings: ServiceSettings, args: argparse.Namespace, act: Act) -> int:
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
    settings, actor = context.settings(env, home), context.actor(args, env)
    return _act(
        settings,
        args,
        lambda reg, pub, now: checkpoints.quarantine(
            reg, pub, args.checkpoint_id, reason=args.reason, actor=actor, now=now
        ),
    )


def cmd_release(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    settings, actor = context.settings(env, home), context.actor(args, env)
    code = _act(
        settings,
        args,
        lambda reg, pub, now: checkpoints.release(
            reg, pub, args.checkpoint_id, reason=args.reason, actor=actor, now=now
        ),
    )
    if not args.json:
        print("it is verified again and becomes valid only if the integrity checks pass")
    return code


def cmd_pin(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    settings, actor = context.settings(env, home), context.actor(args, env)
    reason = args.reason or f"held by {args.by}"
    return _act(
        settings,
        args,
        lambda reg, pub, now: checkpoints.pin(
            reg, pub, args.checkpoint_id, by=args.by, reason=reason, actor=actor, now=now
        ),
    )


def cmd_unpin(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    settings, actor = context.settings(env, home), context.actor(args, env)
    reason = args.reason or f"released by {args.by}"
    return _act(
        settings,
        args,
        lambda reg, pub, now: checkpoints.unpin(
            reg, pub, args.checkpoint_id, by=args.by, reason=reason, actor=actor, now=now
        ),
    )
