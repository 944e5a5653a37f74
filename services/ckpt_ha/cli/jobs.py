"""`ckpt-ha run`: a training command under the runner, relaunched from the restore-coordinator's
plan on failure."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ckpt_ha.cli import context
from ckpt_ha.cli.context import CommandError
from ckpt_ha.cli.parser import UsageError


def cmd_run(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Run the training command under the embedded adapter (`ckpt_ha.runner`)."""
    from uuid import uuid4

    from pydantic import ValidationError

    from ckpt_ha.contracts.job import JobPolicy
    from ckpt_ha.runner.adapter import LocalProcess, SchedulerAdapter
    from ckpt_ha.runner.runner import CannotResume, LaunchFailed, Runner, RunSpec, state_dir
    from ckpt_ha.runner.settings import RunnerSettings
    from ckpt_ha.runner.slurm import SlurmBatch

    command = tuple(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    if not command:
        raise CommandError("no training command: ckpt-ha run --job J [options] -- COMMAND ...")
    if shutil.which(command[0]) is None:
        raise CommandError(f"cannot start {command[0]!r}: not found or not executable")
    if args.scheduler != "slurm" and (args.partition or args.sbatch_arg):
        raise UsageError("--partition and --sbatch-arg need --scheduler slurm")
    if args.scheduler == "slurm":
        missing = [c for c in ("sbatch", "scontrol", "scancel") if shutil.which(c) is None]
        if missing:
            raise UsageError(f"--scheduler slurm: {', '.join(missing)} not found on PATH")
    if args.max_attempts is not None and args.max_attempts < 1:
        raise CommandError("--max-attempts must be >= 1")
    if args.resume and not args.run_id:
        raise CommandError("--resume takes over a run: give its --run-id")
    from ckpt_ha.runner import torchrun

    world_size = args.world_size or torchrun.world_size(command, env) or 1
    if world_size < 1:
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
    settings = context.settings_of(RunnerSettings, env, home, "runner")
    beat = args.heartbeat_s if args.heartbeat_s is not None else settings.heartbeat_s
    if beat < 0:
        raise CommandError("--heartbeat-s must be >= 0")
    heartbeat_s = beat or None
    deadline_s = args.deadline_s if args.deadline_s is not None else settings.deadline_s
    if deadline_s is not None and (heartbeat_s is None or deadline_s <= heartbeat_s):
        raise CommandError("--deadline-s must be longer than --heartbeat-s (which must be > 0)")
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
        world_size=world_size,
        code_version=args.code_version or env.get("CKPT_HA_CODE_VERSION") or None,
        image=env.get("CKPT_HA_IMAGE") or None,
        heartbeat_s=heartbeat_s,
        deadline_s=deadline_s,
        resume=args.resume,
    )
    adapter: SchedulerAdapter = LocalProcess()
    if args.scheduler == "slurm":
        adapter = SlurmBatch(
            partition=args.partition, sbatch_args=args.sbatch_arg, output_dir=spec.state_dir
        )
    runner = Runner(spec, settings.bus(), adapter, base_env=env, job_bus=settings.job_bus())
    try:
        return context.run(settings, runner.run)
    except (LaunchFailed, CannotResume) as exc:
        raise CommandError(str(exc)) from None
