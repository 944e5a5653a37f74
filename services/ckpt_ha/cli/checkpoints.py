"""`ckpt-ha checkpoints list|show`: the registry's view of a job's checkpoints."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ckpt_ha.cli import context, render


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
