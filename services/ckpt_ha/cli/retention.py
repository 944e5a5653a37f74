"""`ckpt-ha retention plan|audit|reconcile`: what the janitor would do now, what was removed or
kept and why, and storage the registry does not know (R6, R11, R13). The old spellings `audit`
and `reconcile` keep working."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, progress, render
from ckpt_ha.cli.arguments import ACTOR_HELP, UsageError, add_json, add_progress, text
from ckpt_ha.cli.confirm import add_confirmation, confirm
from ckpt_ha.cli.errors import Exit

if TYPE_CHECKING:
    from ckpt_ha.cli.arguments import Parser
    from ckpt_ha.ops import reconcile


def register(top: Parser) -> None:
    rt = top.command("retention", help="retention by tier")
    rp = rt.command(
        "plan",
        help="dry run: what the janitor would expire or delete now, and what protects what",
        handler=cmd_plan,
    )
    rp.add_argument("--job")
    rp.add_argument("--all", action="store_true", help="also list checkpoints simply kept")
    add_json(rp)
    au = rt.command(
        "audit",
        help="tombstones (archived ones too), expiries and pins: who removed or kept what, "
        "when and why",
        handler=cmd_audit,
    )
    au.add_argument("--job")
    au.add_argument("--checkpoint")
    add_json(au)
    rc = rt.command(
        "reconcile",
        help="storage objects the registry does not know (deleted only with --delete)",
        handler=cmd_reconcile,
    )
    rc.add_argument(
        "--delete",
        action="store_true",
        help="delete the reported objects (shows them and asks first, unless --yes)",
    )
    rc.add_argument(
        "--min-age",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="only objects older than this are reported for deletion (default 3600: never a "
        "write in progress)",
    )
    rc.add_argument("--reason", type=text, help="required with --delete; recorded")
    rc.add_argument("--actor", type=text, help=ACTOR_HELP)
    add_confirmation(rc)
    add_json(rc)
    add_progress(rc)
    top.alias("audit", au)
    top.alias("reconcile", rc)


def cmd_audit(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import audit
    from ckpt_ha.retention_janitor.api import RetentionJanitorSettings, open_archive

    # The janitor's settings: where it archives tombstones older than its hot days.
    settings = context.settings_of(RetentionJanitorSettings, env, home, "operator")
    archive = open_archive(settings.tombstone_archive, create=False)

    async def query() -> audit.Audit:
        async with context.registry(settings) as registry:
            return await audit.audit(
                registry, archive, job_id=args.job, checkpoint_id=args.checkpoint
            )

    found = context.run(settings, query)
    records, cleaned = found.records, found.cleaned
    if args.json:
        doc = {
            "checkpoints": [
                {
                    "checkpoint_id": r.checkpoint_id,
                    "job_id": r.job_id,
                    "state": r.state.value,
                    "uri": r.uri,
                    "checksums": r.checksums,
                    "tombstone": r.tombstone.model_dump(mode="json") if r.tombstone else None,
                    "expiry": r.expiry.model_dump(mode="json") if r.expiry else None,
                    "pins": [p.model_dump(mode="json") for p in r.pins],
                    "events": [h.model_dump(mode="json") for h in audit.events(r)],
                }
                for r in records
            ],
            "unregistered_objects_deleted": cleaned,
        }
        print(render.dumps(doc))
        return 0
    if not records and not cleaned:
        print("nothing recorded: no checkpoint was expired, deleted, pinned or quarantined")
        return 0
    rows = [
        (h.at.isoformat(), r.checkpoint_id, r.job_id, h.event_type.removeprefix("checkpoint."),
         h.actor, h.reason or "")
        for r in records
        for h in audit.events(r)
    ]  # fmt: skip
    print(render.table(["AT", "CHECKPOINT", "JOB", "ACTION", "ACTOR", "REASON"], sorted(rows)))
    for r in records:
        if r.tombstone is None:
            continue
        t = r.tombstone
        print(
            f"\ntombstone {r.checkpoint_id}: {r.uri} deleted {t.at.isoformat()} by {t.actor}"
            f" ({t.objects_deleted if t.objects_deleted is not None else '?'} objects);"
            f" policy {t.policy or '-'}; reason: {t.reason}"
        )
        for copy in t.copies:
            print(f"  copy {copy}: {r.copies[copy].state.value if copy in r.copies else '?'}")
        for path, digest in sorted(r.checksums.items()):
            print(f"  {path}  {digest}")
    if cleaned:
        print("\nunregistered storage objects deleted by `ckpt-ha reconcile --delete`:")
        print(
            render.table(
                ["AT", "KEY", "BYTES", "ACTOR", "REASON"],
                [(c["at"], c["key"], c["size"], c["actor"], c["reason"]) for c in cleaned],
            )
        )
    return 0


def cmd_reconcile(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Exit 0: nothing unknown (or all of it deleted); 1: unknown objects remain; 3: the
    storage (or Redis) could not be read, nothing done; 5: `--delete` not confirmed."""
    from ckpt_ha.core.clock import utc_now
    from ckpt_ha.integrity_checker.api import IntegrityCheckerSettings
    from ckpt_ha.ops import reconcile
    from ckpt_ha.ops.errors import ListingFailed
    from ckpt_ha.storage import open_store

    deleting = args.delete and not args.dry_run
    if deleting and not args.reason:
        raise UsageError("--delete needs --reason (it is recorded with every deletion)")
    # The integrity-checker's settings: its replica roots hold copies, and their leftovers.
    settings = context.settings_of(IntegrityCheckerSettings, env, home, "operator")
    store = open_store(settings.storage_root)
    roots = sorted(set(settings.replica_roots.values()))
    replicas = {root: open_store(root) for root in roots}

    def find(order: reconcile.Deletion | None) -> reconcile.Reconciliation:
        async def act(tick: progress.Progress | None) -> reconcile.Reconciliation:
            async with context.registry(settings) as registry:
                return await reconcile.reconcile(
                    registry,
                    store,
                    clock=utc_now,
                    min_age_s=args.min_age,
                    delete=order,
                    progress=tick,
                    replicas=replicas,
                )

        try:
            with progress.reporting(args, "reconcile", "registry jobs read") as tick:
                return context.run(settings, lambda: act(tick))
        except ListingFailed as exc:
            msg = f"listing {exc.where or settings.storage_root} failed, nothing done: {exc.error}"
            raise context.Unreachable(msg) from None

    if deleting and not args.yes:
        # What would go, shown before asking; the deletion lists again and still deletes only
        # objects the registry does not know and older than --min-age.
        seen = [o for o in find(None).unknown if o.old_enough]
        if seen:
            size = sum(o.size for o in seen)
            under = ", ".join([settings.storage_root, *roots])
            what = [f"would delete {len(seen)} object(s), {size} bytes, under {under}:",
                    *(f"  {_where(o)}" for o in seen[:20])]  # fmt: skip
            what += [f"  … and {len(seen) - 20} more"] if len(seen) > 20 else []
            confirm(args, what, f"delete {len(seen)} unregistered object(s)?")
    order = reconcile.Deletion(context.actor(args, env), args.reason) if deleting else None
    result = find(order)
    found = result.unknown
    if args.json:
        doc = {"unknown": [o.to_json() for o in found], "deleted": result.deleted}
        print(render.dumps({**doc, "dry_run": True} if args.dry_run else doc))
    elif not found:
        under = " and ".join([settings.storage_root, *roots])
        print(f"every object under {under} belongs to a registered checkpoint (or its copy)")
    else:
        print(
            render.table(
                ["KEY", "BYTES", "MTIME", "STATUS"],
                [
                    (_where(o), o.size, o.mtime.isoformat(),
                     "deleted" if o.deleted
                     else ("unknown (would delete)" if args.dry_run else "unknown")
                     if o.old_enough else "unknown (too young to delete)")
                    for o in found
                ],
            )
        )  # fmt: skip
        if deleting:
            print(f"deleted {result.deleted} object(s); recorded (see `ckpt-ha audit`)")
        else:
            print("unknown to the registry; delete with `ckpt-ha reconcile --delete --reason ...`")
    return Exit.OK if result.clean else Exit.NO


def _where(o: reconcile.UnknownObject) -> str:
    """A primary object by its key, a replica's by its URI (the same key may be on both)."""
    return o.key if o.replica is None else o.uri


def cmd_plan(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import retention
    from ckpt_ha.retention_janitor.api import Decision, RedisResumes, RetentionJanitorSettings

    # The janitor's settings: its view of resumes protects plans as long as it does.
    settings = context.settings_of(RetentionJanitorSettings, env, home, "operator")

    async def query() -> list[Decision]:
        resumes = RedisResumes.from_url(
            settings.redis(), settings.registry_prefix, settings.state_ttl_s
        )
        try:
            async with context.registry(settings) as registry:
                return await retention.plan(
                    registry, resumes, now=datetime.now(UTC), job_id=args.job
                )
        finally:
            await resumes.close()

    decisions = context.run(settings, query)
    if args.json:
        print(render.dumps([d.to_json() for d in decisions]))
        return 0
    shown = decisions if args.all else retention.notable(decisions)
    if not shown:
        print("nothing to expire or delete; nothing kept only by a protection")
        return 0
    print(
        render.table(
            ["JOB", "CHECKPOINT", "STEP", "STATE", "TIER", "ACTION", "PROTECTED BY", "WHY"],
            [
                (d.job_id, d.checkpoint_id, "-" if d.step is None else d.step, d.state.value,
                 d.tier, d.action.value.upper(),
                 ", ".join(p.describe() for p in d.protected_by) or "-", d.reason)
                for d in shown
            ],
        )
    )  # fmt: skip
    return 0
