"""`ckpt-ha job list|show|hold|unhold|restore|stop|run`: a job as on-call sees and steers it, and
a job's training command run under the runner (`job run`, also spelled `run`).

Reading (`list`, `show`) goes to the event stream and the registry with the operator's
credentials, like `ckpt-ha restores` and `ckpt-ha checkpoints list`: it works against any
deployment, and nothing is read from the runner's host (no pid files, no logs).

Acting goes through events the operator publishes, each recorded with its actor and reason:

- ``hold`` / ``unhold`` publish ``job.held`` / ``job.unheld``. The restore-coordinator applies them
  to its projection (rebuildable from the stream): a held job's failures are recorded, not
  planned (each one's decision waits as *held*); on ``unhold`` the latest failure is planned if
  nothing was decided about it yet. Older held failures stay undecided: only the latest attempt
  can be restored.
- ``restore --to CKPT`` publishes ``job.restore_requested``; the coordinator answers with a
  ``resume.planned`` for that checkpoint (mode exact when compatible) and the runner relaunches
  from it. Newer valid checkpoints stay valid (nothing is quarantined). The CLI refuses
  another job's checkpoint or one that is not valid with one line before publishing anything.
- ``stop`` publishes ``job.stop_requested``; the job's runner stops the attempt and ends the run.

``run`` runs a training command; on failure the runner relaunches it from the
restore-coordinator's plan.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, render
from ckpt_ha.cli.arguments import ACTOR_HELP, Parser, UsageError, add_json, positive, text
from ckpt_ha.cli.errors import CommandError, Exit

if TYPE_CHECKING:
    from ckpt_ha.contracts import Envelope, EventData
    from ckpt_ha.contracts.job import JobPolicy
    from ckpt_ha.runner.launch import RunSpec
    from ckpt_ha.runner.settings import RunnerSettings
    from ckpt_ha.runtime.settings import ServiceSettings

INDEX_WAIT_S = 5.0
"""How long ``job list|show`` wait for the job index to catch up with the stream."""
"""How long a read of the stream waits for a matching message before it calls the stream read."""

ACTS = (
    ("hold", "pause automatic restores of a job (its failures are recorded, not planned)"),
    ("unhold", "resume automatic restores (the latest failure is planned if still undecided)"),
    ("restore", "restore a job from a chosen valid checkpoint of its own (newer ones stay)"),
    ("stop", "stop a job: its runner stops the running attempt and ends the run"),
)


def register(top: Parser) -> None:
    jb = top.command(
        "job",
        help="a job's timeline (attempts, failures, plans, loads, verdicts, escalations) and the "
        "operator's acts on it: hold, unhold, restore --to, stop; run: its training command "
        "under the runner",
    )
    add_json(jb.command("list", help="every job in the event stream and where it stands",
                        handler=cmd_list))  # fmt: skip
    jsh = jb.command(
        "show",
        help="one job: attempts, failures, plans, loads, verdicts, escalations, pins",
        handler=cmd_show,
    )
    jsh.add_argument("job", type=text)
    add_json(jsh)
    handlers = {"hold": cmd_hold, "unhold": cmd_unhold, "restore": cmd_restore, "stop": cmd_stop}
    for name, help_text in ACTS:
        act = jb.command(name, help=help_text, handler=handlers[name])
        act.add_argument("job", type=text)
        if name == "restore":
            act.add_argument("--to", required=True, type=text, metavar="CHECKPOINT_ID",
                             help="a valid checkpoint of this job")  # fmt: skip
        act.add_argument("--reason", type=text, help="why (recorded)")
        act.add_argument("--actor", type=text, help=ACTOR_HELP)
        add_json(act)
    run = jb.command(
        "run",
        help="run a training command; on failure relaunch it from the restore-coordinator's plan",
        description="Exit codes: 0 the command succeeded; 1 gave up (--max-attempts) or a "
        "dependency is unreachable; 2 bad arguments; 3 escalated to a human (reason and next "
        "step on stderr); 4 no resume plan within --plan-timeout; 5 a user cancelled the "
        "attempt (scancel; never restored); 128+N stopped by signal N.",
        handler=cmd_run,
    )
    _run_arguments(run)
    top.alias("run", run)


def _run_arguments(run: Parser) -> None:
    run.add_argument("--job", required=True, type=text)
    pol = run.add_mutually_exclusive_group()
    pol.add_argument("--policy", type=Path, help="the job's JobPolicy as a JSON file")
    pol.add_argument("--tier", type=text, help="only a tier name; the other policy defaults")
    run.add_argument("--run-id", type=text, help="default: a new id")
    run.add_argument(
        "--plan-timeout",
        type=positive,
        default=120.0,
        metavar="SECONDS",
        help="after a failure, how long to wait for the coordinator's plan (default 120)",
    )
    run.add_argument("--max-attempts", type=int, metavar="N", help="stop after N attempts")
    run.add_argument(
        "--world-size",
        type=int,
        help="recorded topology (default: torchrun's --nproc-per-node x --nnodes, else 1)",
    )
    run.add_argument("--code-version", type=text, help="default: $CKPT_HA_CODE_VERSION")
    _scheduler_arguments(run)
    _liveness_arguments(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")


def _scheduler_arguments(run: Parser) -> None:
    run.add_argument(
        "--scheduler",
        choices=["local", "slurm"],
        default="local",
        help="local: a child process (default); slurm: each attempt is an sbatch job "
        "(--no-requeue), its end read from scontrol (docs/SCHEDULERS.md)",
    )
    run.add_argument("--partition", type=text, help="with --scheduler slurm: sbatch --partition")
    run.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="with --scheduler slurm: one more sbatch option, as --sbatch-arg=--mem=4G "
        "(repeatable); never one the adapter sets (--requeue, --output, --export, …)",
    )


def _liveness_arguments(run: Parser) -> None:
    run.add_argument(
        "--heartbeat-s",
        type=float,
        metavar="SECONDS",
        help="publish job.heartbeat this often while an attempt runs (default "
        "$CKPT_HA_HEARTBEAT_S, else 10; 0: never, and the attempt is never declared lost)",
    )
    run.add_argument(
        "--deadline-s",
        type=positive,
        metavar="SECONDS",
        help="silence (no progress, no heartbeat) after which the restore-coordinator declares "
        "an attempt lost (default $CKPT_HA_DEADLINE_S, else the tier's: `ckpt-ha tier show`); "
        "above --heartbeat-s",
    )
    run.add_argument(
        "--hang-after-s",
        type=float,
        metavar="SECONDS",
        help="silence of the training's progress (outside saves, evaluations and its first "
        "steps) after which a live attempt is hung, stopped and restored (default "
        "$CKPT_HA_HANG_AFTER_S, else adaptive: 5 x the 95th percentile of its recent gaps "
        "between progress reports, "
        "at least 30 s; 0: never)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="take over a lost run (same --job and --run-id): wait for the coordinator's plan "
        "after the attempt the run's state folder records, then carry on",
    )


async def _index_settled(settings: ServiceSettings) -> None:
    """Wait, at most `INDEX_WAIT_S`, until the job index has every event the stream held when
    the command started (its durable acknowledged them); then read it anyway, saying on stderr
    how far behind it is (a stopped restore-coordinator, a backlog)."""
    import nats
    import nats.js.errors

    from ckpt_ha.restore_coordinator.api import INDEX_DURABLE

    cfg = settings.bus()
    nc = await nats.connect(
        cfg.servers, **cfg.connect_options(), **cfg.connection_policy(lasting=False)
    )
    try:
        js = nc.jetstream(timeout=cfg.request_timeout_s)
        last = (await js.stream_info(cfg.events_stream)).state.last_seq
        deadline = asyncio.get_running_loop().time() + INDEX_WAIT_S
        while True:
            try:
                info = await js.consumer_info(cfg.events_stream, INDEX_DURABLE)
            except nats.js.errors.NotFoundError:
                print("ckpt-ha: the job index has no consumer (no restore-coordinator ran): "
                      "read as it is", file=sys.stderr)  # fmt: skip
                return
            done = info.ack_floor.stream_seq if info.ack_floor else 0
            if done >= last or not (info.num_pending or info.num_ack_pending):
                return
            if asyncio.get_running_loop().time() > deadline:
                print(f"ckpt-ha: the job index is {last - done} event(s) behind the stream",
                      file=sys.stderr)  # fmt: skip
                return
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


async def _indexed(
    settings: ServiceSettings, wanted: list[str] | None = None
) -> list[Envelope[EventData]]:
    """The events of these jobs (every job: None) from the restore-coordinator's job index,
    job after job, each job's in stream order (`ckpt_ha.ops.jobs.from_index`)."""
    from ckpt_ha.contracts import CATALOG
    from ckpt_ha.contracts.errors import ContractError
    from ckpt_ha.ops import jobs
    from ckpt_ha.registry.client import connect
    from ckpt_ha.restore_coordinator.api import JobIndexReader

    def decoded(raws: list[bytes]) -> list[Envelope[EventData]]:
        out = []
        for raw in raws:
            try:
                out.append(CATALOG.decode(raw))
            except ContractError:
                continue  # as the stream reader skips what it cannot read
        return out

    await _index_settled(settings)
    client = connect(settings.redis())
    try:
        index = JobIndexReader(client, settings.registry_prefix)
        names = await index.jobs() if wanted is None else wanted
        found = await index.raw_events(names)
    finally:
        await client.aclose()
    return [e for name in names
            for e in jobs.from_index(decoded(found[name][0]), decoded(found[name][1]))]  # fmt: skip


def cmd_list(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import jobs

    settings = context.settings(env, home)

    async def read() -> list[jobs.Summary]:
        return jobs.summaries(await _indexed(settings))

    found = context.run(settings, read)
    if args.json:
        print(render.dumps([s.to_json() for s in found]))
        return 0
    if not found:
        print("no jobs in the event stream")
        return 0
    rows = [
        (s.job_id, s.state + (" (held)" if s.held else ""), str(s.attempt or "-"),
         str(s.last_step if s.last_step is not None else "-"), str(s.failures),
         s.last_event_at.isoformat(timespec="seconds") if s.last_event_at else "-")
        for s in found
    ]  # fmt: skip
    print(render.table(["JOB", "STATE", "ATTEMPT", "STEP", "FAILURES", "LAST EVENT"], rows))
    return 0


def cmd_show(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import jobs

    settings = context.settings(env, home)

    async def read() -> jobs.JobView | None:
        events = await _indexed(settings, [args.job])
        async with context.registry(settings) as registry:
            records = await registry.by_job(args.job)
        async with context.restore_owners(settings) as (pins, _):
            fallback = await pins.pins(args.job)
        return jobs.show(args.job, events, records, fallback)

    view = context.run(settings, read)
    if view is None:
        raise CommandError(f"no job {args.job!r}: no event and no checkpoint of it", Exit.NO)
    if args.json:
        print(render.dumps(view.to_json()))
        return 0
    s = view.summary
    held = ", automatic restores HELD" if s.held else ""
    print(f"job {s.job_id}: {s.state}{held}; run {s.run_id or '-'}, attempt {s.attempt or '-'}, "
          f"last step {s.last_step if s.last_step is not None else '-'}")  # fmt: skip
    nv = view.newest_valid
    print(f"newest valid checkpoint: {f'{nv.checkpoint_id} (step {nv.step})' if nv else 'none'}")
    for ckpt, by, actor, reason in view.pins:
        print(f"pinned: {ckpt} by {by} ({actor}): {reason}")
    print()
    for e in view.timeline:
        print(f"{e.at.isoformat(timespec='seconds')}  {e.kind:<17} {e.summary}")
        for line in e.details:
            print(f"{'':>39}{line}")
    return 0


def _act(args: argparse.Namespace, env: dict[str, str], home: Path, data_of: str) -> int:
    """Publish one operator act on a job (`data_of`: which event), recorded with its actor."""
    from datetime import UTC, datetime

    from ckpt_ha.contracts import job as contract
    from ckpt_ha.contracts.checkpoint import CheckpointState
    from ckpt_ha.ops import manual

    settings = context.settings(env, home)
    who = context.actor(args, env)
    common = {"job_id": args.job, "actor": who, "reason": args.reason or ""}
    data: EventData
    if data_of == "restore":
        data = contract.JobRestoreRequestedV1(**common, checkpoint_id=args.to)
    else:
        kinds: dict[str, type[EventData]] = {"hold": contract.JobHeldV1,
                                             "unhold": contract.JobUnheldV1,
                                             "stop": contract.JobStopRequestedV1}  # fmt: skip
        data = kinds[data_of](**common)

    async def act() -> list[str]:
        if isinstance(data, contract.JobRestoreRequestedV1):
            async with context.registry(settings) as registry:
                record = await registry.get(data.checkpoint_id)
            if record is None:
                raise CommandError(f"no checkpoint {data.checkpoint_id!r} in the registry")
            if record.job_id != data.job_id:
                raise CommandError(
                    f"checkpoint {record.checkpoint_id} belongs to job {record.job_id}, "
                    f"not {data.job_id}"
                )
            if record.state is not CheckpointState.VALID:
                raise CommandError(
                    f"checkpoint {record.checkpoint_id} is {record.state.value}, not valid: "
                    "only a valid checkpoint can be restored"
                )
        async with context.publisher(settings) as pub:
            return await manual.publish(pub, [data], now=datetime.now(UTC))

    ids = context.run(settings, act)
    doc = {"job_id": args.job, "event": data.EVENT_TYPE, "event_id": ids[0], "actor": who,
           "reason": args.reason or ""}  # fmt: skip
    if args.json:
        print(render.dumps(doc))
    else:
        print(f"{data.EVENT_TYPE} recorded for job {args.job} by {who} (event {ids[0]})")
    return 0


def cmd_hold(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    return _act(args, env, home, "hold")


def cmd_unhold(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    return _act(args, env, home, "unhold")


def cmd_restore(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    return _act(args, env, home, "restore")


def cmd_stop(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    return _act(args, env, home, "stop")


def cmd_run(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Run the training command under the embedded adapter (`ckpt_ha.runner`)."""
    from ckpt_ha.runner import torchrun
    from ckpt_ha.runner.adapter import LocalProcess, SchedulerAdapter
    from ckpt_ha.runner.runner import CannotResume, LaunchFailed, Runner
    from ckpt_ha.runner.settings import RunnerSettings
    from ckpt_ha.runner.slurm import SlurmBatch

    command = tuple(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    _check_run(args, command)
    world_size = args.world_size or torchrun.world_size(command, env) or 1
    if world_size < 1:
        raise UsageError("--world-size must be >= 1")
    policy = _policy(args)
    settings = context.settings_of(RunnerSettings, env, home, "runner")
    spec = _spec(args, env, home, settings, command, policy, world_size)
    adapter: SchedulerAdapter = LocalProcess(watch_ranks=True)
    if args.scheduler == "slurm":
        adapter = SlurmBatch(
            partition=args.partition, sbatch_args=args.sbatch_arg, output_dir=spec.state_dir
        )
    runner = Runner(spec, settings.bus(), adapter, base_env=env, job_bus=settings.job_bus())
    try:
        return context.run(settings, runner.run)
    except (LaunchFailed, CannotResume) as exc:
        raise CommandError(str(exc)) from None


def _check_run(args: argparse.Namespace, command: tuple[str, ...]) -> None:
    """What `run` refuses before it reads any setting."""
    if not command:
        raise UsageError("no training command: ckpt-ha run --job J [options] -- COMMAND ...")
    if shutil.which(command[0]) is None:
        raise UsageError(f"cannot start {command[0]!r}: not found or not executable")
    if args.scheduler != "slurm" and (args.partition or args.sbatch_arg):
        raise UsageError("--partition and --sbatch-arg need --scheduler slurm")
    from ckpt_ha.runner.slurm import AdapterInvariant, check_sbatch_args

    try:
        check_sbatch_args(args.sbatch_arg)
    except AdapterInvariant as exc:
        raise UsageError(str(exc)) from None
    if args.scheduler == "slurm":
        missing = [c for c in ("sbatch", "scontrol", "scancel") if shutil.which(c) is None]
        if missing:
            raise UsageError(f"--scheduler slurm: {', '.join(missing)} not found on PATH")
    if args.max_attempts is not None and args.max_attempts < 1:
        raise UsageError("--max-attempts must be >= 1")
    if args.resume and not args.run_id:
        raise UsageError("--resume takes over a run: give its --run-id")


def _policy(args: argparse.Namespace) -> JobPolicy:
    """The job's policy: ``--policy FILE``, else the defaults with ``--tier``."""
    from pydantic import ValidationError

    from ckpt_ha.contracts.job import JobPolicy

    policy = JobPolicy(tier=args.tier)
    if args.policy is None:
        return policy
    try:
        return JobPolicy.model_validate_json(args.policy.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read --policy {args.policy}: {exc.strerror}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise UsageError(f"--policy {args.policy}: {where}: {first['msg']}") from None


def _spec(
    args: argparse.Namespace,
    env: dict[str, str],
    home: Path,
    settings: RunnerSettings,
    command: tuple[str, ...],
    policy: JobPolicy,
    world_size: int,
) -> RunSpec:
    from uuid import uuid4

    from ckpt_ha.runner.launch import RunSpec
    from ckpt_ha.runner.runner import state_dir

    beat = args.heartbeat_s if args.heartbeat_s is not None else settings.heartbeat_s
    if beat < 0:
        raise UsageError("--heartbeat-s must be >= 0")
    heartbeat_s = beat or None
    deadline_s = args.deadline_s if args.deadline_s is not None else settings.deadline_s
    if deadline_s is not None and (heartbeat_s is None or deadline_s <= heartbeat_s):
        raise UsageError("--deadline-s must be longer than --heartbeat-s (which must be > 0)")
    hang_after_s = args.hang_after_s if args.hang_after_s is not None else settings.hang_after_s
    if hang_after_s is not None and hang_after_s < 0:
        raise UsageError("--hang-after-s must be >= 0")
    run_id = args.run_id or f"run-{uuid4().hex[:12]}"
    return RunSpec(
        job_id=args.job,
        run_id=run_id,
        command=command,
        storage_root=settings.storage_root,
        state_dir=state_dir(home, args.job, run_id),
        policy=policy,
        plan_timeout_s=args.plan_timeout,
        max_attempts=args.max_attempts,
        world_size=world_size,
        code_version=args.code_version or env.get("CKPT_HA_CODE_VERSION") or None,
        image=env.get("CKPT_HA_IMAGE") or None,
        heartbeat_s=heartbeat_s,
        deadline_s=deadline_s,
        hang_after_s=hang_after_s,
        resume=args.resume,
    )
