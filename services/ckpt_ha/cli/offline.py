"""The offline `ckpt-ha` commands: a verdict from the files alone, no NATS, Redis or services.

They need only the base install (no `server` extra), so a training image or a laptop with the
light SDK can still check a checkpoint folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


COMMANDS: dict[str, Callable[[argparse.Namespace, dict[str, str], Path], int]] = {
    "verify": cmd_verify,
    "latest-valid": cmd_latest_valid,
}
