"""`ckpt-ha policy advise`: how often to checkpoint (R3), with its cost."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_ha.cli import context, render
from ckpt_ha.cli.arguments import add_json, count, non_negative, positive, text

if TYPE_CHECKING:
    from ckpt_ha.cli.arguments import Parser
    from ckpt_ha.core import interval
    from ckpt_ha.ops import policy


def register(top: Parser) -> None:
    po = top.command("policy", help="checkpoint policy")
    adv = po.command(
        "advise",
        help="how often to checkpoint: Young's and Daly's interval, time lost, storage per day",
        description="Either --job J (measured from the registry; any other option overrides "
        "the measured value) or --write-seconds and --mtbf-hours. All numbers are model "
        "estimates. Exit codes: 0 advice given (warnings possible); 1 no interval is workable "
        "(write time >= MTBF) or nothing to measure; 2 bad arguments; 3 a dependency is "
        "unreachable (docs/CLI.md#exit-codes).",
        handler=cmd_advise,
    )
    adv.add_argument("--job", type=text, help="measure from this job's registry records")
    adv.add_argument("--write-seconds", type=positive, metavar="S",
                     help="time one checkpoint write holds training up")  # fmt: skip
    adv.add_argument("--mtbf-hours", type=positive, metavar="H",
                     help="mean time between failures")  # fmt: skip
    adv.add_argument("--restart-seconds", type=non_negative, metavar="R",
                     help="failure to training again: relaunch + load (default 0)")  # fmt: skip
    adv.add_argument("--current-interval-seconds", type=positive, metavar="C",
                     help="compute time between checkpoints now (end of one write to the "
                     "start of the next)")  # fmt: skip
    adv.add_argument("--checkpoint-bytes", type=non_negative, metavar="B",
                     help="size of one checkpoint (with --job: median total_bytes)")  # fmt: skip
    adv.add_argument("--keep", type=count, metavar="N",
                     help="retention keeps the last N (steady-state footprint)")  # fmt: skip
    adv.add_argument("--prior-mtbf-hours", type=positive, default=24.0, metavar="H",
                     help="with --job: the MTBF prior, worth one failure (default 24)")  # fmt: skip
    add_json(adv)


def _given(args: argparse.Namespace) -> policy.Given:
    from ckpt_ha.ops import policy

    return policy.Given(
        write_s=args.write_seconds,
        mtbf_s=args.mtbf_hours * 3600 if args.mtbf_hours is not None else None,
        restart_s=args.restart_seconds,
        current_s=args.current_interval_seconds,
        checkpoint_bytes=args.checkpoint_bytes,
        keep=args.keep,
        prior_mtbf_s=args.prior_mtbf_hours * 3600,
    )


def cmd_advise(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Interval advice (R3): exit 0 advice, 1 unworkable or nothing to measure, 2 usage."""
    from ckpt_ha.core import interval
    from ckpt_ha.ops import policy

    given = _given(args)
    if args.job is None:
        missing = [o for o, v in (("--write-seconds", args.write_seconds),
                                  ("--mtbf-hours", args.mtbf_hours)) if v is None]  # fmt: skip
        if missing:
            print(f"ckpt-ha: give --job J, or {' and '.join(missing)}", file=sys.stderr)
            return 2
        inputs, notes = policy.given_only(given), list[str]()
    else:
        settings = context.settings(env, home)

        async def measure() -> tuple[policy.Inputs, list[str]]:
            async with (
                context.registry(settings) as registry,
                context.restore_owners(settings) as (_, restores),
            ):
                return await policy.measured(registry, restores, args.job, given)

        inputs, notes = context.run(settings, measure)
    try:
        advice = inputs.advise()
    except interval.BadInput as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return 2
    code = 1 if advice.verdict == "unworkable" else 0
    if args.json:
        print(render.dumps(_doc(args.job, advice, notes)))
        return code
    _print_advice(args.job, advice, notes)
    return code


def _print_advice(job: str | None, advice: interval.Advice, notes: list[str]) -> None:
    head = f"job {job}: " if job else ""
    print(f"{head}checkpoint interval advice (model estimates, not measurements of the future)")
    rows: list[tuple[str, str, str]] = [
        ("write time S", render.span(advice.write_s), ""),
        ("MTBF M", render.span(advice.mtbf_s), ""),
        ("restart time R", render.span(advice.restart_s), ""),
        ("Young sqrt(2SM)", render.span(advice.young_s), f"{advice.waste_young:.2%}"),
        ("Daly (advised)", render.span(advice.daly_s), f"{advice.waste_daly:.2%}"),
    ]
    if advice.current_s is not None and advice.waste_current is not None:
        rows.append(("current", render.span(advice.current_s), f"{advice.waste_current:.2%}"))
    print(render.table(["", "SECONDS", "TIME LOST"], rows))
    st = [("advised", advice.storage_daly)]
    if advice.storage_current is not None:
        st.append(("current", advice.storage_current))
    print()
    print(
        render.table(
            ["STORAGE", "CHECKPOINTS/DAY", "GROWTH/DAY", f"KEEP-LAST {advice.keep or '-'}"],
            [
                (
                    name,
                    f"{s.checkpoints_per_day:.1f}",
                    render.size(s.bytes_per_day),
                    render.size(s.steady_state_bytes),
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


def _doc(job: str | None, advice: interval.Advice, notes: list[str]) -> dict[str, Any]:
    return {
        "job": job,
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
