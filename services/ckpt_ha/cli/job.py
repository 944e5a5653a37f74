"""`ckpt-ha job list|show|hold|unhold|restore|stop`: a job as on-call sees and steers it.

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
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, render
from ckpt_ha.cli.context import CommandError

if TYPE_CHECKING:
    from ckpt_ha.contracts import Envelope, EventData
    from ckpt_ha.runtime.settings import ServiceSettings

IDLE_S = 2.0
"""How long a read of the stream waits for a matching message before it calls the stream read."""


async def _events(settings: ServiceSettings, subject_filter: str) -> list[Envelope[EventData]]:
    """The events on ``subject_filter`` (``{p}`` is the subject prefix), in stream order."""
    from ckpt_ha.bus.stream_reader import read_events
    from ckpt_ha.contracts import CATALOG

    cfg = settings.bus()
    f = subject_filter.format(p=cfg.prefix)
    events, _ = await read_events(cfg, CATALOG, f, idle_timeout=IDLE_S)
    return events


def cmd_list(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import jobs

    settings = context.settings(env, home)

    async def read() -> list[jobs.Summary]:
        return jobs.summaries(await _events(settings, "{p}.ev.>"))

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
    from ckpt_ha.contracts.subjects import job_token
    from ckpt_ha.ops import jobs

    settings = context.settings(env, home)

    async def read() -> jobs.JobView | None:
        events = await _events(settings, "{p}.ev.*.*.*." + job_token(args.job))
        async with context.registry(settings) as registry:
            records = await registry.by_job(args.job)
        async with context.restore_owners(settings) as (pins, _):
            fallback = await pins.pins(args.job)
        return jobs.show(args.job, events, records, fallback)

    view = context.run(settings, read)
    if view is None:
        raise CommandError(f"no job {args.job!r}: no event and no checkpoint of it")
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
