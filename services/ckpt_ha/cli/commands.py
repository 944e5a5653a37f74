"""What each `ckpt-ha` command does. Output for people is a table; `--json` is for machines."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.errors
import redis.exceptions

from ckpt_ha.contracts import EventData
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core import interval
from ckpt_ha.devstack import stack
from ckpt_ha.registry.redis_registry import CheckpointRecord, Registry
from ckpt_ha.runtime.settings import ServiceSettings

# Commands import what only they need (faststream, boto3) inside their function, so that the
# read-only commands an operator runs at 3 a.m. start fast.

T = TypeVar("T")


class CommandError(Exception):
    """A failure to report in one line (exit 1)."""


def _settings(env: Mapping[str, str], home: Path) -> ServiceSettings:
    """Shared settings, pointed at the local stack when NATS_URL / REDIS_URL are not set."""
    overrides: dict[str, Any] = {}
    state = stack.StackState.load(home)
    if state is not None:
        if not env.get("NATS_URL"):
            overrides["nats_url"] = state.nats_url
        if not env.get("REDIS_URL"):
            overrides["redis_url"] = state.redis_url
        if not env.get("CKPT_HA_STORAGE_ROOT"):
            overrides["storage_root"] = state.storage_root
    return ServiceSettings(**overrides)


def _run(settings: ServiceSettings, coro: Callable[[], Awaitable[T]]) -> T:
    try:
        return asyncio.run(coro())  # type: ignore[arg-type]
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise CommandError(f"cannot reach Redis at {settings.redis_url}: {exc}") from None
    except (nats.errors.NoServersError, nats.errors.TimeoutError, OSError) as exc:
        raise CommandError(f"cannot reach NATS at {settings.nats_url}: {exc!r}") from None


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def _record_rows(records: Sequence[CheckpointRecord], tier: str = "-") -> str:
    return _table(
        ["CHECKPOINT", "STEP", "STATE", "TIER", "PINS", "FORMAT", "UPDATED", "URI"],
        [
            (
                r.checkpoint_id,
                "-" if r.step is None else r.step,
                r.state.value,
                tier,
                ",".join(p.by for p in r.pins) or "-",
                r.format.value,
                r.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
                r.uri,
            )
            for r in records
        ],
    )


def dispatch(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    handler = _COMMANDS[(args.command, getattr(args, "action", None))]
    return handler(args, env, home)


def cmd_serve(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.runtime.catalog import entries

    entry = entries()[args.name]
    settings = entry.settings()
    svc = entry.build(settings)
    asyncio.run(svc.run(settings))
    return 0


def cmd_up(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    try:
        state = stack.up(home, env)
    except Exception as exc:  # noqa: BLE001 - a failed start is reported in one line
        raise CommandError(f"up failed: {exc}") from None
    print(f"ckpt-ha local stack under {home}")
    print(_status_table(state))
    return 0


def _status_table(state: stack.StackState) -> str:
    return _table(
        ["COMPONENT", "PID", "ALIVE", "HEALTHY", "URL"],
        [(s.name, s.pid, s.alive, s.healthy, s.url) for s in stack.status(state)],
    )


def cmd_down(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    stopped = stack.down(home)
    print(f"stopped: {', '.join(stopped)}" if stopped else f"nothing running under {home}")
    return 0


def cmd_status(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    state = stack.StackState.load(home)
    if state is None:
        raise CommandError(f"no local stack under {home} (start it with `ckpt-ha up`)")
    rows = stack.status(state)
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        print(_status_table(state))
    return 0 if all(r.healthy for r in rows) else 1


def cmd_checkpoints_list(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    settings = _settings(env, home)

    async def query() -> tuple[list[CheckpointRecord], str | None, Any]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            state = CheckpointState(args.state) if args.state else None
            records = await registry.by_job(args.job, state=state)
            return records, await registry.owner(args.job), await registry.tier_of(args.job)
        finally:
            await registry.close()

    records, owner, tier = _run(settings, query)
    if args.json:
        docs = [{**r.model_dump(mode="json"), "tier": tier.tier.name} for r in records]
        print(json.dumps(docs, indent=2))
    elif not records:
        print(f"no checkpoints registered for job {args.job}")
    else:
        print(
            f"job {args.job}, owned by {owner or 'no project'},"
            f" tier {tier.tier.name} ({tier.source}: {tier.detail})"
        )
        print(_record_rows(records, tier.tier.name))
    return 0


def cmd_checkpoints_show(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    settings = _settings(env, home)

    async def query() -> tuple[CheckpointRecord | None, Any]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            record = await registry.get(args.checkpoint_id)
            tier = await registry.tier_of(record.job_id) if record is not None else None
            return record, tier
        finally:
            await registry.close()

    record, tier = _run(settings, query)
    if record is None:
        raise CommandError(f"no checkpoint {args.checkpoint_id!r} in the registry")
    if args.json:
        print(record.model_dump_json(indent=2))
        return 0
    print(_record_rows([record], tier.tier.name))
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
        _table(
            ["AT", "STATE", "EVENT", "ACTOR", "REASON"],
            [
                (h.at.isoformat(), h.state.value, h.event_type, h.actor, h.reason or "")
                for h in record.history
            ],
        )
    )
    return 0


def cmd_registry_rebuild(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.contracts import CATALOG
    from ckpt_ha.registrar.rebuild import rebuild

    settings = _settings(env, home)

    async def run() -> str:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            if await registry.dump():
                if not args.clear:
                    raise CommandError(
                        "the registry is not empty; stop the registrar and pass --clear to "
                        "replace it with a rebuild from the event stream"
                    )
                await registry.clear()
            report = await rebuild(registry, settings.bus(), CATALOG)
        finally:
            await registry.close()
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(report.skipped.items())) or "none"
        return (
            f"read {report.read} checkpoint events: applied {report.applied}, "
            f"duplicates {report.duplicates}, skipped {skipped}"
        )

    print(_run(settings, run))
    return 0


def cmd_dead_letters(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    settings = _settings(env, home)

    async def read() -> list[dict[str, Any]]:
        nc = await nats.connect(settings.nats_url, connect_timeout=3, max_reconnect_attempts=1)
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(settings.dead_letter_stream)
            except nats.js.errors.NotFoundError:
                return []
            out: list[dict[str, Any]] = []
            first = max(info.state.first_seq, info.state.last_seq - args.limit + 1)
            for seq in range(first, info.state.last_seq + 1) if info.state.messages else ():
                try:
                    msg = await js.get_msg(settings.dead_letter_stream, seq)
                except nats.js.errors.NotFoundError:
                    continue
                h = msg.headers or {}
                out.append(
                    {
                        "seq": seq,
                        "consumer": h.get("Ckpt-Consumer"),
                        "code": h.get("Ckpt-Error-Code"),
                        "deliveries": h.get("Ckpt-Delivery-Count"),
                        "subject": h.get("Ckpt-Original-Subject"),
                        "error": h.get("Ckpt-Error"),
                        "bytes": len(msg.data or b""),
                    }
                )
            return out
        finally:
            await nc.close()

    letters = _run(settings, read)
    if args.json:
        print(json.dumps(letters, indent=2))
    elif not letters:
        print("no dead letters")
    else:
        print(
            _table(
                ["SEQ", "CONSUMER", "CODE", "DELIVERIES", "SUBJECT", "ERROR"],
                [
                    (
                        d["seq"],
                        d["consumer"],
                        d["code"],
                        d["deliveries"],
                        d["subject"],
                        str(d["error"])[:80],
                    )
                    for d in letters
                ],
            )
        )
    return 0


def cmd_verify(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Exit 0 valid, 1 anything else; a path that does not exist is a usage error (2)."""
    from ckpt_ha.formats import verify_path

    if not args.path.exists():
        print(f"ckpt-ha: {args.path}: no such file or directory", file=sys.stderr)
        return 2
    report = verify_path(args.path, args.checksum)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        step = "-" if report.step is None else report.step
        verdict, fmt = report.verdict.value.upper(), report.format.value
        print(f"{verdict}  {args.path}  format={fmt}  step={step}")
        for reason in report.reasons:
            print(f"  - {reason}")
        if report.ok:
            print(f"  checks: {', '.join(report.checks)}; {report.bytes_read} bytes read")
    return 0 if report.ok else 1


def cmd_latest_valid(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Exit 0 when a valid checkpoint exists, 1 when none does, 2 for a missing root."""
    from ckpt_ha.formats import latest_valid
    from ckpt_ha.storage import FsStore

    if not args.root.is_dir():
        print(f"ckpt-ha: {args.root}: not a directory", file=sys.stderr)
        return 2
    chosen, reports = latest_valid(FsStore(args.root))
    rejected: list[dict[str, Any]] = []
    for folder, report in reports:
        if folder == chosen:
            break
        rejected.append(
            {"path": str(args.root / folder), "step": report.step,
             "verdict": report.verdict.value, "reasons": report.reasons[:5]}
        )  # fmt: skip
    chosen_report = dict(reports).get(chosen) if chosen else None
    if args.json:
        doc = {
            "path": str(args.root / chosen) if chosen else None,
            "step": chosen_report.step if chosen_report else None,
            "format": chosen_report.format.value if chosen_report else None,
            "rejected": rejected,
        }
        print(json.dumps(doc, indent=2))
    else:
        for r in rejected:
            why = r["reasons"][0] if r["reasons"] else ""
            print(f"rejected  {r['path']}  step={r['step']}  {r['verdict']}: {why}")
        if chosen_report is not None:
            print(f"LATEST VALID  {args.root / str(chosen)}  step={chosen_report.step}")
        else:
            print(f"no valid checkpoint under {args.root}")
    return 0 if chosen else 1


def cmd_demo(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Until the drill exists: start the stack, write a checkpoint, show it registered."""
    from ckpt_ha.bus.broker import Bus
    from ckpt_ha.contracts import build
    from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat
    from ckpt_ha.formats import native
    from ckpt_ha.formats.identity import checkpoint_id_on
    from ckpt_ha.storage import open_store

    cmd_up(args, env, home)
    settings = _settings(env, home)
    store = open_store(settings.storage_root)
    now = datetime.now(UTC)
    prefix = f"{args.job}/step-{args.step:08d}-{now.strftime('%Y%m%dT%H%M%S')}"
    shards = {f"shard-{i}.bin": bytes([i]) * (64 * 1024) for i in range(2)}
    native.write(store, prefix, shards, step=args.step, created_at=now)
    # The id the writer-watcher derives from the same files, so both name one checkpoint.
    checkpoint_id = checkpoint_id_on(store, prefix)
    event = build(
        CheckpointCommittedV1(
            job_id=args.job,
            checkpoint_id=checkpoint_id,
            uri=store.uri(prefix),
            run_id="demo-run",
            step=args.step,
            format=CheckpointFormat.NATIVE,
            shard_count=len(shards),
            total_bytes=sum(len(v) for v in shards.values()),
        ),
        source="ckpt-ha/demo",
        time=now,
        key=checkpoint_id,
    )

    async def publish_and_wait() -> CheckpointRecord:
        bus = Bus(settings.bus(), "demo")
        await bus.broker.start()
        try:
            await bus.publish(event)
        finally:
            await bus.broker.stop()
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            settled = {CheckpointState.VALID, CheckpointState.QUARANTINED}
            for _ in range(300):
                record = await registry.get(checkpoint_id)
                if record is not None and record.state in settled:
                    return record
                await asyncio.sleep(0.05)
        finally:
            await registry.close()
        raise CommandError(f"checkpoint {checkpoint_id} was not verified within 15 s")

    _run(settings, publish_and_wait)
    print(f"\nwrote {len(shards)} shards + manifest to {store.uri(prefix)}")
    print(f"(check it offline: ckpt-ha verify {settings.storage_root}/{prefix})")
    print(
        f"published checkpoint.committed for {checkpoint_id}; the integrity-checker verified it"
        " on storage and the registrar recorded the result:\n"
    )
    args.json, args.state = False, None
    cmd_checkpoints_list(args, env, home)
    print("\nstop the stack with `ckpt-ha down`")
    return 0


def cmd_run(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Run the training command under the embedded adapter (`ckpt_ha.runner`)."""
    from uuid import uuid4

    from pydantic import ValidationError

    from ckpt_ha.contracts.job import JobPolicy
    from ckpt_ha.runner.adapter import LocalProcess
    from ckpt_ha.runner.runner import LaunchFailed, Runner, RunSpec, state_dir

    command = tuple(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    if not command:
        raise CommandError("no training command: ckpt-ha run --job J [options] -- COMMAND ...")
    if shutil.which(command[0]) is None:
        raise CommandError(f"cannot start {command[0]!r}: not found or not executable")
    if args.max_attempts is not None and args.max_attempts < 1:
        raise CommandError("--max-attempts must be >= 1")
    if args.world_size < 1:
        raise CommandError("--world-size must be >= 1")
    policy = JobPolicy(tier=args.tier)
    if args.policy is not None:
        try:
            policy = JobPolicy.model_validate_json(args.policy.read_bytes())
        except OSError as exc:
            raise CommandError(f"cannot read --policy {args.policy}: {exc.strerror}") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(document)"
            raise CommandError(f"--policy {args.policy}: {where}: {first['msg']}") from None
    settings = _settings(env, home)
    run_id = args.run_id or f"run-{uuid4().hex[:12]}"
    spec = RunSpec(
        job_id=args.job,
        run_id=run_id,
        command=command,
        storage_root=settings.storage_root,
        state_dir=state_dir(home, args.job, run_id),
        policy=policy,
        plan_timeout_s=args.plan_timeout,
        max_attempts=args.max_attempts,
        world_size=args.world_size,
        code_version=args.code_version or env.get("CKPT_HA_CODE_VERSION") or None,
        image=env.get("CKPT_HA_IMAGE") or None,
    )
    runner = Runner(spec, settings.bus(), LocalProcess(), base_env=env)
    try:
        return _run(settings, runner.run)
    except LaunchFailed as exc:
        raise CommandError(str(exc)) from None


def _actor(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    import getpass

    actor = args.actor or env.get("CKPT_HA_ACTOR") or env.get("USER") or env.get("LOGNAME")
    if not actor:
        try:
            actor = getpass.getuser()
        except (OSError, KeyError):
            actor = None
    if not actor:
        raise CommandError("who is acting? pass --actor NAME (or set CKPT_HA_ACTOR)")
    return str(actor)


async def _publish_manual(
    settings: ServiceSettings,
    datas: Sequence[EventData],
    record: CheckpointRecord | None = None,
) -> list[str]:
    """Publish operator actions (each a new fact with its own id); return the event ids.

    An action on a checkpoint goes into that checkpoint's trace (stored by the registry)."""
    from uuid import uuid4

    from ckpt_ha.bus.broker import Bus
    from ckpt_ha.contracts import build

    now = datetime.now(UTC)
    tp, ts = (record.traceparent, record.tracestate) if record is not None else (None, None)
    envelopes = [
        build(d, source="ckpt-ha/cli", time=now, key=uuid4().hex, traceparent=tp, tracestate=ts)
        for d in datas
    ]
    bus = Bus(settings.bus(), "cli")
    await bus.broker.start()
    try:
        for envelope in envelopes:
            await bus.publish(envelope)
    finally:
        await bus.broker.stop()
    return [e.id for e in envelopes]


async def _await_recorded(
    registry: Registry, checkpoint_id: str, event_id: str
) -> CheckpointRecord:
    """The record once the registrar has projected ``event_id`` (bounded wait)."""
    for _ in range(200):
        record = await registry.get(checkpoint_id)
        if record is not None and any(h.event_id == event_id for h in record.history):
            return record
        await asyncio.sleep(0.05)
    raise CommandError(
        f"published, but the registrar has not recorded it within 10 s (is it running? "
        f"see `ckpt-ha status` and `ckpt-ha dead-letters`); event {event_id}"
    )


def _checkpoint_action(
    args: argparse.Namespace,
    env: dict[str, str],
    home: Path,
    decide: Callable[[CheckpointRecord, str, str], EventData],
    reason: str | None = None,
) -> int:
    from ckpt_ha.cli import actions

    settings = _settings(env, home)
    actor = _actor(args, env)

    async def act() -> CheckpointRecord:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            record = await registry.get(args.checkpoint_id)
            if record is None:
                raise CommandError(f"no checkpoint {args.checkpoint_id!r} in the registry")
            try:
                data = decide(record, reason or args.reason, actor)
            except actions.ActionRefused as exc:
                raise CommandError(str(exc)) from None
            [event_id] = await _publish_manual(settings, [data], record)
            return await _await_recorded(registry, record.checkpoint_id, event_id)
        finally:
            await registry.close()

    record = _run(settings, act)
    if args.json:
        print(record.model_dump_json(indent=2))
    else:
        last = record.history[-1]
        was = record.history[-2].state.value if len(record.history) > 1 else "-"
        print(
            f"{record.checkpoint_id}: {was} -> {record.state.value}"
            f" by {last.actor} at {last.at.isoformat()}: {last.reason}"
        )
    return 0


def cmd_quarantine(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.cli import actions

    return _checkpoint_action(args, env, home, actions.quarantine)


def cmd_release(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.cli import actions

    code = _checkpoint_action(args, env, home, actions.release)
    if not args.json:
        print("it is verified again and becomes valid only if the integrity checks pass")
    return code


def cmd_owner_transfer(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.cli import actions

    if args.from_project is None and not args.job:
        raise CommandError("give --from PROJECT, or --job J for jobs that have no project yet")
    settings = _settings(env, home)
    actor = _actor(args, env)

    async def act() -> dict[str, str | None]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            jobs = args.job or await registry.jobs_of(args.from_project)
            owners = {job: await registry.owner(job) for job in jobs}
            try:
                datas = actions.transfer(
                    owners, args.from_project, args.to_project, args.reason, actor
                )
            except actions.ActionRefused as exc:
                raise CommandError(str(exc)) from None
            event_ids = await _publish_manual(settings, datas)
            for _ in range(200):
                logs = {job: await registry.owner_log(job) for job in jobs}
                done = {e.event_id for log in logs.values() for e in log}
                if set(event_ids) <= done:
                    return {job: await registry.owner(job) for job in jobs}
                await asyncio.sleep(0.05)
            raise CommandError(
                "published, but the registrar has not recorded the transfer within 10 s "
                "(see `ckpt-ha dead-letters`: a job moved meanwhile is refused there)"
            )
        finally:
            await registry.close()

    now = _run(settings, act)
    if args.json:
        print(json.dumps({"transferred": now, "to": args.to_project}, indent=2))
    else:
        for job, owner in sorted(now.items()):
            print(f"{job}: {args.from_project or 'no project'} -> {owner} (by {actor})")
    return 0


def cmd_owner_show(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    settings = _settings(env, home)
    if args.project is not None:
        return _project_show(args, settings)

    async def query() -> tuple[str | None, list[Any]]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            return await registry.owner(args.job), await registry.owner_log(args.job)
        finally:
            await registry.close()

    owner, log = _run(settings, query)
    if args.json:
        print(
            json.dumps(
                {"job": args.job, "owner": owner, "log": [e.model_dump(mode="json") for e in log]},
                indent=2,
            )
        )
        return 0
    print(f"job {args.job}: owned by {owner or 'no project'}")
    if log:
        print(
            _table(
                ["AT", "FROM", "TO", "ACTOR", "REASON"],
                [
                    (e.at.isoformat(), e.from_project or "-", e.to_project, e.actor, e.reason)
                    for e in log
                ],
            )
        )
    return 0


def _project_show(args: argparse.Namespace, settings: ServiceSettings) -> int:
    """A project's jobs and what is left of them: the index outlives jobs, archived projects and
    departed owners (R5); deleted checkpoints stay as tombstones."""

    async def query() -> list[dict[str, Any]]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            out = []
            for job in await registry.jobs_of(args.project):
                records = await registry.by_job(job)
                states: dict[str, int] = {}
                for r in records:
                    states[r.state.value] = states.get(r.state.value, 0) + 1
                latest = next((r for r in records if r.state is CheckpointState.VALID), None)
                out.append(
                    {
                        "job": job,
                        "tier": (await registry.tier_of(job)).tier.name,
                        "checkpoints": states,
                        "latest_valid": latest.checkpoint_id if latest else None,
                    }
                )
            return out
        finally:
            await registry.close()

    jobs = _run(settings, query)
    if args.json:
        print(json.dumps({"project": args.project, "jobs": jobs}, indent=2))
    elif not jobs:
        print(f"project {args.project} owns no jobs")
    else:
        print(
            _table(
                ["JOB", "TIER", "LATEST VALID", "CHECKPOINTS"],
                [
                    (j["job"], j["tier"], j["latest_valid"] or "-",
                     " ".join(f"{k}={v}" for k, v in sorted(j["checkpoints"].items())))
                    for j in jobs
                ],
            )
        )  # fmt: skip
    return 0


def cmd_drill(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.drill import run as drill

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = drill.run(args.scenario, home, env, log, budget_s=args.budget)
    results = result if isinstance(result, list) else [result]
    if args.report:
        from ckpt_ha.drill import report

        folder = Path(args.report)
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in report.files(result).items():
            (folder / name).write_text(text, encoding="utf-8")
        log(f"report: {folder / 'report.html'} (also report.md, report.json)")
    if args.json:
        print(drill.as_json(result))
    else:
        print("\n\n".join(drill.as_text(r) for r in results))
        if args.report:
            print(f"\nreport: {Path(args.report) / 'report.html'}")
    return 0 if all(r["verdict"] == "pass" for r in results) else 1


def _checkpoint_times(record: CheckpointRecord) -> interval.CheckpointTimes:
    """When a record's write started and was committed, from its history (see `interval`)."""

    def first(state: CheckpointState) -> datetime | None:
        return next((h.at for h in record.history if h.state is state), None)

    started = first(CheckpointState.WRITING)
    if started is None and record.identity is not None:
        started = record.identity.created_at  # the writer's clock when it began the save
    return interval.CheckpointTimes(
        started=started,
        committed=first(CheckpointState.PENDING_VERIFICATION),
        run_id=record.run_id,
        total_bytes=record.total_bytes,
    )


def _measure(
    args: argparse.Namespace, settings: ServiceSettings
) -> tuple[dict[str, Any], list[str]]:
    """The advisor's inputs for ``--job``: measured from the registry and the restore
    coordinator's failure log, each overridden by an explicit option."""
    from ckpt_ha.restore_coordinator.adapters import CoordinatorState, failure_of
    from ckpt_ha.restore_coordinator.domain import Failure

    async def read() -> tuple[list[CheckpointRecord], list[Failure]]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            records = await registry.by_job(args.job)
            # The coordinator's log of the job's failures, one per attempt (a job.failed heard
            # twice is one entry); read by its own key layout, written only by the coordinator.
            coordinator = CoordinatorState(registry.r, settings.registry_prefix)
            raws = await registry.r.hgetall(coordinator.k("failures", args.job))
            return records, [failure_of(v) for v in raws.values()]
        finally:
            await registry.close()

    records, failures = _run(settings, read)
    if not records:
        raise CommandError(f"no checkpoints registered for job {args.job}: nothing to measure")
    times = [_checkpoint_times(r) for r in records]
    sources: dict[str, str] = {}
    notes: list[str] = []

    write_s = args.write_seconds
    if write_s is None:
        est = interval.write_time(times)
        if est.value is None:
            raise CommandError(
                f"job {args.job}: no checkpoint with both a write start and a commit time; "
                "pass --write-seconds"
            )
        write_s, sources["write_seconds"] = est.value, f"measured: {est.how}"
    mtbf_s = args.mtbf_hours * 3600 if args.mtbf_hours is not None else None
    if mtbf_s is None:
        activity = [t for c in times for t in (c.started, c.committed) if t is not None]
        m = interval.mtbf([f.at for f in failures], activity, args.prior_mtbf_hours * 3600)
        assert m.value is not None
        mtbf_s = m.value
        sources["mtbf_seconds"] = (
            f"estimated from {m.failures} failure(s) in the restore coordinator's log "
            f"(<prefix>:coord:failures:{args.job}): {m.how}"
        )
        notes.extend(m.notes)
    current_s = args.current_interval_seconds
    if current_s is None:
        est = interval.current_interval(times, write_s)
        current_s = est.value
        sources["current_interval_seconds"] = f"measured: {est.how}"
    size = args.checkpoint_bytes
    if size is None:
        est = interval.checkpoint_size(times)
        size = est.value
        if size is not None:
            sources["checkpoint_bytes"] = f"measured: {est.how}"
    if args.restart_seconds is None:
        notes.append("restart time not measured: assumed 0 (pass --restart-seconds)")
    return {
        "write_s": write_s,
        "mtbf_s": mtbf_s,
        "restart_s": args.restart_seconds or 0.0,
        "current_s": current_s,
        "checkpoint_bytes": size,
        "keep": args.keep,
    }, [f"{k}: {v}" for k, v in sources.items()] + notes


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds:.0f} s ({seconds / 60:.1f} min)"
    return f"{seconds:.0f} s ({seconds / 3600:.2f} h)"


def cmd_policy_advise(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Interval advice (R3): exit 0 advice, 1 unworkable or nothing to measure, 2 usage."""
    from dataclasses import asdict

    if args.job is None:
        missing = [o for o, v in (("--write-seconds", args.write_seconds),
                                  ("--mtbf-hours", args.mtbf_hours)) if v is None]  # fmt: skip
        if missing:
            print(f"ckpt-ha: give --job J, or {' and '.join(missing)}", file=sys.stderr)
            return 2
        inputs: dict[str, Any] = {
            "write_s": args.write_seconds,
            "mtbf_s": args.mtbf_hours * 3600,
            "restart_s": args.restart_seconds or 0.0,
            "current_s": args.current_interval_seconds,
            "checkpoint_bytes": args.checkpoint_bytes,
            "keep": args.keep,
        }
        notes: list[str] = []
    else:
        inputs, notes = _measure(args, _settings(env, home))
    try:
        advice = interval.advise(**inputs)
    except interval.BadInput as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return 2
    code = 1 if advice.verdict == "unworkable" else 0
    if args.json:
        doc = {
            "job": args.job,
            "verdict": advice.verdict,
            "young_seconds": advice.young_s,
            "daly_seconds": advice.daly_s,
            "advised_seconds": advice.daly_s,
            "advised_period_seconds": advice.daly_s + advice.write_s,
            "current_interval_seconds": advice.current_s,
            "write_seconds": advice.write_s,
            "mtbf_seconds": advice.mtbf_s,
            "mtbf_hours": advice.mtbf_s / 3600,
            "restart_seconds": advice.restart_s,
            "waste_advised": advice.waste_daly,
            "waste_young": advice.waste_young,
            "waste_current": advice.waste_current,
            "checkpoint_bytes": advice.checkpoint_bytes,
            "keep": advice.keep,
            "storage_advised": asdict(advice.storage_daly),
            "storage_current": (
                asdict(advice.storage_current) if advice.storage_current is not None else None
            ),
            "model": "waste(tau) = S/tau + (tau + S)/(2M) + R/M (first order)",
            "warnings": list(advice.warnings),
            "notes": notes,
            "estimates": True,
        }
        print(json.dumps(doc, indent=2))
        return code
    head = f"job {args.job}: " if args.job else ""
    print(f"{head}checkpoint interval advice (model estimates, not measurements of the future)")
    rows: list[tuple[str, str, str]] = [
        ("write time S", _span(advice.write_s), ""),
        ("MTBF M", _span(advice.mtbf_s), ""),
        ("restart time R", _span(advice.restart_s), ""),
        ("Young sqrt(2SM)", _span(advice.young_s), f"{advice.waste_young:.2%}"),
        ("Daly (advised)", _span(advice.daly_s), f"{advice.waste_daly:.2%}"),
    ]
    if advice.current_s is not None and advice.waste_current is not None:
        rows.append(("current", _span(advice.current_s), f"{advice.waste_current:.2%}"))
    print(_table(["", "SECONDS", "TIME LOST"], rows))
    st = [("advised", advice.storage_daly)]
    if advice.storage_current is not None:
        st.append(("current", advice.storage_current))
    print()
    print(
        _table(
            ["STORAGE", "CHECKPOINTS/DAY", "GROWTH/DAY", f"KEEP-LAST {advice.keep or '-'}"],
            [
                (
                    name,
                    f"{s.checkpoints_per_day:.1f}",
                    _size(s.bytes_per_day),
                    _size(s.steady_state_bytes),
                )
                for name, s in st
            ],
        )
    )
    print("\nmodel: time lost = S/tau + (tau + S)/(2M) + R/M; tau = compute time between writes")
    for note in notes:
        print(f"note: {note}")
    for warning in advice.warnings:
        print(f"warning: {warning}")
    print(f"verdict: {advice.verdict}")
    return code


def cmd_pin(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.cli import actions

    reason = args.reason or f"held by {args.by}"
    return _checkpoint_action(
        args, env, home, lambda r, _, actor: actions.pin(r, args.by, reason, actor), reason
    )


def cmd_unpin(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.cli import actions

    reason = args.reason or f"released by {args.by}"
    return _checkpoint_action(
        args, env, home, lambda r, _, actor: actions.unpin(r, args.by, reason, actor), reason
    )


AUDIT_EVENTS = frozenset(
    {
        "checkpoint.expired",
        "checkpoint.deleted",
        "checkpoint.pinned",
        "checkpoint.unpinned",
        "checkpoint.quarantined",
        "checkpoint.released",
    }
)
"""What `ckpt-ha audit` shows of a checkpoint's history: what people and retention did to it."""


def cmd_audit(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    settings = _settings(env, home)

    async def query() -> tuple[list[CheckpointRecord], list[dict[str, Any]]]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            if args.checkpoint:
                record = await registry.get(args.checkpoint)
                records = [record] if record is not None else []
            elif args.job:
                records = await registry.by_job(args.job)
            else:
                records = [
                    *await registry.by_state(CheckpointState.DELETED),
                    *await registry.by_state(CheckpointState.EXPIRED),
                ]
            records = [r for r in records if any(h.event_type in AUDIT_EVENTS for h in r.history)]
            cleaned = []
            if not args.checkpoint:
                cleaned = await registry.reconcile_log()
            return records, cleaned
        finally:
            await registry.close()

    records, cleaned = _run(settings, query)
    if args.checkpoint and not records:
        raise CommandError(f"nothing to audit for checkpoint {args.checkpoint!r}")
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
                    "events": [
                        h.model_dump(mode="json") for h in r.history if h.event_type in AUDIT_EVENTS
                    ],
                }
                for r in records
            ],
            "unregistered_objects_deleted": cleaned,
        }
        print(json.dumps(doc, indent=2))
        return 0
    if not records and not cleaned:
        print("nothing recorded: no checkpoint was expired, deleted, pinned or quarantined")
        return 0
    rows = [
        (h.at.isoformat(), r.checkpoint_id, r.job_id, h.event_type.removeprefix("checkpoint."),
         h.actor, h.reason or "")
        for r in records
        for h in r.history
        if h.event_type in AUDIT_EVENTS
    ]  # fmt: skip
    print(_table(["AT", "CHECKPOINT", "JOB", "ACTION", "ACTOR", "REASON"], sorted(rows)))
    for r in records:
        if r.tombstone is None:
            continue
        t = r.tombstone
        print(
            f"\ntombstone {r.checkpoint_id}: {r.uri} deleted {t.at.isoformat()} by {t.actor}"
            f" ({t.objects_deleted if t.objects_deleted is not None else '?'} objects);"
            f" policy {t.policy or '-'}; reason: {t.reason}"
        )
        for path, digest in sorted(r.checksums.items()):
            print(f"  {path}  {digest}")
    if cleaned:
        print("\nunregistered storage objects deleted by `ckpt-ha reconcile --delete`:")
        print(
            _table(
                ["AT", "KEY", "BYTES", "ACTOR", "REASON"],
                [(c["at"], c["key"], c["size"], c["actor"], c["reason"]) for c in cleaned],
            )
        )
    return 0


def cmd_reconcile(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Exit 0: nothing unknown (or all of it deleted); 1: unknown objects remain."""
    from ckpt_ha.retention_janitor import adapters, domain
    from ckpt_ha.storage import StorageError, open_store

    if args.delete and not args.reason:
        raise CommandError("--delete needs --reason (it is recorded with every deletion)")
    settings = _settings(env, home)
    actor = _actor(args, env) if args.delete else None
    store = open_store(settings.storage_root)

    async def act() -> tuple[list[dict[str, Any]], int]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            # The registry first: an object registered between the two reads is then listed
            # but known, never the other way round.
            known: list[str] = []
            for job in await registry.jobs():
                for record in await registry.by_job(job):
                    known += adapters.locations(store, record)
            try:
                infos = await asyncio.to_thread(lambda: list(store.list("")))
            except StorageError as exc:
                msg = f"listing {settings.storage_root} failed, nothing done: {exc}"
                raise CommandError(msg) from None
            unknown = set(domain.unknown_objects([i.key for i in infos], known))
            now = datetime.now(UTC)
            found = [
                {
                    "key": i.key,
                    "uri": store.uri(i.key),
                    "size": i.size,
                    "mtime": i.mtime.isoformat(),
                    "old_enough": (now - i.mtime).total_seconds() >= args.min_age,
                }
                for i in infos
                if i.key in unknown
            ]
            deleted = 0
            if args.delete:
                for obj in found:
                    if not obj["old_enough"]:
                        continue
                    try:
                        await asyncio.to_thread(store.delete, obj["key"])
                    except StorageError as exc:
                        raise CommandError(
                            f"deleted {deleted} object(s), then storage failed: {exc}"
                        ) from None
                    entry = {
                        "key": obj["key"],
                        "uri": obj["uri"],
                        "size": obj["size"],
                        "actor": actor,
                        "reason": args.reason,
                        "at": datetime.now(UTC).isoformat(),
                    }
                    await registry.record_reconcile_deletion(entry)
                    obj["deleted"] = True
                    deleted += 1
            return found, deleted
        finally:
            await registry.close()

    found, deleted = _run(settings, act)
    if args.json:
        print(json.dumps({"unknown": found, "deleted": deleted}, indent=2))
    elif not found:
        print(f"every object under {settings.storage_root} belongs to a registered checkpoint")
    else:
        print(
            _table(
                ["KEY", "BYTES", "MTIME", "STATUS"],
                [
                    (o["key"], o["size"], o["mtime"],
                     "deleted" if o.get("deleted")
                     else "unknown" if o["old_enough"] else "unknown (too young to delete)")
                    for o in found
                ],
            )
        )  # fmt: skip
        if args.delete:
            print(f"deleted {deleted} object(s); recorded (see `ckpt-ha audit`)")
        else:
            print("unknown to the registry; delete with `ckpt-ha reconcile --delete --reason ...`")
    return 0 if all(o.get("deleted") for o in found) else 1


def cmd_retention_plan(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.retention_janitor.domain import Action
    from ckpt_ha.retention_janitor.handlers import dry_run

    settings = _settings(env, home)

    async def query() -> list[Any]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            return await dry_run(registry, datetime.now(UTC), [args.job] if args.job else None)
        finally:
            await registry.close()

    decisions = _run(settings, query)
    if args.json:
        print(json.dumps([d.to_json() for d in decisions], indent=2))
        return 0
    shown = [d for d in decisions if args.all or d.action is not Action.KEEP or d.protected_by]
    if not shown:
        print("nothing to expire or delete; nothing kept only by a protection")
        return 0
    print(
        _table(
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


def cmd_tier_set(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.cli import actions

    settings = _settings(env, home)
    actor = _actor(args, env)

    async def act() -> Any:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            current = await registry.tier_of(args.job)
            known = args.job in await registry.jobs()
            try:
                data = actions.choose_tier(
                    args.job, current, args.tier, args.reason, actor, known_job=known
                )
            except actions.ActionRefused as exc:
                raise CommandError(str(exc)) from None
            [event_id] = await _publish_manual(settings, [data])
            for _ in range(200):
                chosen = await registry.chosen_tier(args.job)
                if chosen is not None and chosen.event_id == event_id:
                    return current, chosen
                await asyncio.sleep(0.05)
            raise CommandError(
                f"published, but the registrar has not recorded it within 10 s; event {event_id}"
            )
        finally:
            await registry.close()

    before, chosen = _run(settings, act)
    if args.json:
        print(chosen.model_dump_json(indent=2))
    else:
        print(
            f"job {args.job}: tier {before.tier.name} ({before.source}) -> {chosen.tier}"
            f" by {chosen.actor} at {chosen.at.isoformat()}: {chosen.reason}"
        )
    return 0


def cmd_tier_show(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.core.tiers import TIERS, span

    table = [
        {
            "tier": t.name,
            "cost": t.cost,
            "interval_s": t.interval_s,
            "keep_last": t.keep_last,
            "keep_every": t.keep_every,
            "keep_best": (
                f"{t.keep_best.count}x{t.keep_best.direction}({t.keep_best.metric})"
                if t.keep_best
                else None
            ),
            "max_age_s": t.max_age_s,
            "quarantine_keep_s": t.quarantine_keep_s,
            "failed_keep_s": t.failed_keep_s,
            "grace_s": t.grace_s,
            "replicate": t.replicate,
        }
        for t in sorted(TIERS.values(), key=lambda t: t.cost)
    ]
    if args.job is None:
        if args.json:
            print(json.dumps(table, indent=2))
            return 0
        rows = [
            [span(v) if k.endswith("_s") and isinstance(v, float) else ("-" if v is None else v)
             for k, v in row.items()]
            for row in table
        ]  # fmt: skip
        print(_table([k.removesuffix("_s") for k in table[0]], rows))
        return 0
    settings = _settings(env, home)

    async def query() -> tuple[Any, list[Any]]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        try:
            return await registry.tier_of(args.job), await registry.tier_log(args.job)
        finally:
            await registry.close()

    choice, log = _run(settings, query)
    if args.json:
        print(
            json.dumps(
                {
                    "job": args.job,
                    "tier": choice.tier.name,
                    "source": choice.source,
                    "detail": choice.detail,
                    "policy": choice.tier.policy(),
                    "log": [e.model_dump(mode="json") for e in log],
                },
                indent=2,
            )
        )
        return 0
    print(f"job {args.job}: tier {choice.tier.name} ({choice.source}: {choice.detail})")
    print(f"policy: {choice.tier.policy()}")
    if log:
        print(
            _table(
                ["AT", "TIER", "ACTOR", "REASON"],
                [(e.at.isoformat(), e.tier, e.actor, e.reason) for e in log],
            )
        )
    return 0


_COMMANDS: dict[tuple[str, str | None], Callable[[argparse.Namespace, dict[str, str], Path], int]]
_COMMANDS = {
    ("run", None): cmd_run,
    ("serve", None): cmd_serve,
    ("up", None): cmd_up,
    ("down", None): cmd_down,
    ("status", None): cmd_status,
    ("checkpoints", "list"): cmd_checkpoints_list,
    ("checkpoints", "show"): cmd_checkpoints_show,
    ("registry", "rebuild"): cmd_registry_rebuild,
    ("dead-letters", None): cmd_dead_letters,
    ("verify", None): cmd_verify,
    ("latest-valid", None): cmd_latest_valid,
    ("demo", None): cmd_demo,
    ("drill", None): cmd_drill,
    ("quarantine", None): cmd_quarantine,
    ("release", None): cmd_release,
    ("owner", "transfer"): cmd_owner_transfer,
    ("owner", "show"): cmd_owner_show,
    ("policy", "advise"): cmd_policy_advise,
    ("pin", None): cmd_pin,
    ("unpin", None): cmd_unpin,
    ("audit", None): cmd_audit,
    ("reconcile", None): cmd_reconcile,
    ("retention", "plan"): cmd_retention_plan,
    ("tier", "set"): cmd_tier_set,
    ("tier", "show"): cmd_tier_show,
}
