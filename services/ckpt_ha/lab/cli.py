"""`ckpt-ha stack up|down|status|demo|drill`: the embedded local stack, a guided tour on it, and
fault drills that prove recovery on it. The old spellings `up`, `down`, `demo` and `drill` keep
working; `status` is now the product's (`ckpt_ha.cli.status`, against any deployment).

The lab's commands, registered into the `ckpt-ha` parser through the ``ckpt_ha.cli`` entry point
(the product never imports the lab). This module imports nothing of the lab's extra at import
time; each command first checks that the `lab` extra is installed (`require_extra`), and the CLI
reports a missing one in one line (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, render
from ckpt_ha.cli.arguments import STORAGE_HELP, add_json, needs_s3_endpoint, storage_root
from ckpt_ha.cli.errors import CommandError, Exit
from ckpt_ha.lab import require_extra

if TYPE_CHECKING:
    from ckpt_ha.cli.arguments import Parser
    from ckpt_ha.runtime import local_stack

SCENARIOS = ("node-exit", "storage-outage", "corrupt-checkpoint", "storage-lost", "restart-loop",
             "env-mismatch", "torchrun-dcp", "hf-trainer", "hang", "reshard", "slurm-node-lost",
             "all")  # fmt: skip


def register(top: Parser) -> None:
    st = top.command("stack", help="the embedded local stack (NATS, Redis, the five services)")
    up = st.command(
        "up", help="start the embedded local stack (NATS, Redis, the five services)", handler=cmd_up
    )
    up.add_argument("--storage", type=storage_root, metavar="ROOT", help=STORAGE_HELP)
    add_json(up)
    down = st.command("down", help="stop exactly the processes `up` started", handler=cmd_down)
    add_json(down)
    status = st.command(
        "status", help="each component of the local stack and its health", handler=cmd_status
    )
    add_json(status)
    demo = st.command(
        "demo", help="start the stack, write a checkpoint, show it registered", handler=cmd_demo
    )
    demo.add_argument("--job", default="demo-job")
    demo.add_argument("--step", type=int, default=100)
    drill = st.command(
        "drill",
        help="inject a fault into a real job on the embedded stack and prove recovery",
        handler=cmd_drill,
    )
    _drill_arguments(drill)
    # `status` is the product's own (`ckpt_ha.cli.status`: any deployment); the local stack's
    # processes are `stack status`.
    for old, parser in (("up", up), ("down", down), ("drill", drill), ("demo", demo)):
        top.alias(old, parser)


def _drill_arguments(dr: Parser) -> None:
    dr.add_argument(
        "--scenario",
        required=True,
        choices=SCENARIOS,
        help="the fault to inject; all: every scenario in turn on one stack (the framework "
        "drills only where the torch and hf extras are installed; the others say so) except "
        "slurm-node-lost, which needs Slurm (scripts/slurm-tools)",
    )
    dr.add_argument("--json", action="store_true",
                    help="the evidence as JSON: one object, a list of them for all")  # fmt: skip
    dr.add_argument("--report", metavar="DIR",
                    help="write report.md, report.json and a standalone report.html")  # fmt: skip
    dr.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                    help="per drill: stop it and report it failed when it runs longer")  # fmt: skip
    dr.add_argument("--storage", type=storage_root, metavar="ROOT",
                    help=STORAGE_HELP + " (default: the running stack's, else "
                    "$CKPT_HA_STORAGE_ROOT, else ~/.ckpt-ha/storage)")  # fmt: skip


def _status_table(state: local_stack.StackState) -> str:
    from ckpt_ha.lab.devstack import stack

    return render.table(
        ["COMPONENT", "PID", "ALIVE", "HEALTHY", "URL"],
        [(s.name, s.pid, s.alive, s.healthy, s.url) for s in stack.status(state)],
    )


def cmd_up(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.lab.devstack import stack

    require_extra()  # after the server-side import: a light install names the server extra

    storage = getattr(args, "storage", None)  # `demo` starts the stack without the option
    if storage:
        env = {**env, "CKPT_HA_STORAGE_ROOT": storage}
    try:
        # On a local S3-compatible server, in front of it the link the storage-outage drill cuts.
        state = stack.up(home, env, storage_link=bool(storage and env.get("AWS_ENDPOINT_URL")))
    except Exception as exc:  # noqa: BLE001 - a failed start is reported in one line
        raise CommandError(f"up failed: {exc}") from None
    if getattr(args, "json", False):  # `demo` has no --json
        doc = {
            "home": str(home),
            "storage_root": state.storage_root,
            "components": [r.__dict__ for r in stack.status(state)],
        }
        print(render.dumps(doc))
        return 0
    print(f"ckpt-ha local stack under {home}, storage root {state.storage_root}")
    print(_status_table(state))
    return 0


def cmd_down(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.lab.devstack import stack

    require_extra()  # after the server-side import: a light install names the server extra

    stopped = stack.down(home)
    if args.json:
        print(render.dumps({"home": str(home), "stopped": stopped}))
        return 0
    print(f"stopped: {', '.join(stopped)}" if stopped else f"nothing running under {home}")
    return 0


def cmd_status(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.lab.devstack import stack

    require_extra()  # after the server-side import: a light install names the server extra
    from ckpt_ha.runtime import local_stack

    state = local_stack.StackState.load(home)
    if state is None:
        raise CommandError(f"no local stack under {home} (start it with `ckpt-ha up`)", Exit.NO)
    rows = stack.status(state)
    if args.json:
        print(render.dumps([r.__dict__ for r in rows]))
    else:
        print(_status_table(state))
        print(f"\nstorage root: {state.storage_root}")
        print(
            "  a job J's checkpoints go in <storage root>/J/<one folder per checkpoint>, e.g. a "
            "Hugging Face Trainer's output_dir=<storage root>/J"
        )
    return 0 if all(r.healthy for r in rows) else 1


def cmd_demo(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Start the stack, write a checkpoint, show it registered."""
    from ckpt_ha.cli import checkpoints
    from ckpt_ha.lab import demo
    from ckpt_ha.storage import open_store

    cmd_up(args, env, home)
    settings = context.settings(env, home)
    store = open_store(settings.storage_root)
    written = demo.write(store, args.job, args.step, datetime.now(UTC))

    async def announce() -> None:
        async with (
            context.publisher(settings, "demo") as publisher,
            context.registry(settings) as registry,
        ):
            await demo.announce(publisher, registry, written)

    context.run(settings, announce)
    print(f"\nwrote {written.shards} shards + manifest to {store.uri(written.prefix)}")
    print(f"(check it offline: ckpt-ha verify {settings.storage_root}/{written.prefix})")
    print(
        f"published checkpoint.committed for {written.checkpoint_id}; the integrity-checker"
        " verified it on storage and the registrar recorded the result:\n"
    )
    args.json, args.state = False, None
    checkpoints.cmd_list(args, env, home)
    print("\nstop the stack with `ckpt-ha down`")
    return 0


def cmd_drill(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.lab.drill import run as drill

    require_extra()  # after the server-side import: a light install names the server extra

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    from ckpt_ha.lab.devstack.stack import StackConflict

    needs_s3_endpoint(args.storage, env)
    try:
        result = drill.run(args.scenario, home, env, log, budget_s=args.budget,
                           storage=args.storage)  # fmt: skip
    except StackConflict as exc:
        raise CommandError(str(exc)) from None
    results = result if isinstance(result, list) else [result]
    if args.report:
        from ckpt_ha.lab.drill import report

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
    # Under `all`, a drill this installation cannot run says so in its result and fails nothing;
    # asked for by name, not running it is a failure.
    fine = ("pass", drill.NOT_RUN) if args.scenario == "all" else ("pass",)
    return 0 if all(r["verdict"] in fine for r in results) else 1
