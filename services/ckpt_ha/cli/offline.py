"""The offline `ckpt-ha` commands, `verify` and `latest-valid`: a verdict from the files alone, no
NATS, Redis or services.

They need only the base install (no `server` extra), so a training image or a laptop with the
light SDK can still check a checkpoint folder: this module imports nothing server-side.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ckpt_ha.cli import render


def cmd_verify(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Exit 0 valid, 1 anything else; a path that does not exist is a usage error (2)."""
    from ckpt_ha.formats import verify_path

    if not args.path.exists():
        print(f"ckpt-ha: {args.path}: no such file or directory", file=sys.stderr)
        return 2
    report = verify_path(args.path, args.checksum)
    if args.json:
        print(render.dumps(report.to_json()))
    else:
        step = "-" if report.step is None else report.step
        verdict, fmt = report.verdict.value.upper(), report.format.value
        print(f"{verdict}  {args.path}  format={fmt}  step={step}")
        for reason in report.reasons:
            print(f"  - {reason}")
        for note in report.notes:
            print(f"  note: {note}")
        if report.ok:
            print(f"  checks: {', '.join(report.checks)}; {report.bytes_read} bytes read")
    return 0 if report.ok else 1


def cmd_latest_valid(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Exit 0 when a valid checkpoint exists, 1 when none does, 2 for a missing root."""
    from ckpt_ha.ops.offline import newest_valid

    if not args.root.is_dir():
        print(f"ckpt-ha: {args.root}: not a directory", file=sys.stderr)
        return 2
    found = newest_valid(args.root)
    if args.json:
        doc = {
            "path": str(found.path) if found.path is not None else None,
            "step": found.report.step if found.report else None,
            "format": found.report.format.value if found.report else None,
            "rejected": [r.to_json() for r in found.rejected],
        }
        print(render.dumps(doc))
    else:
        for r in found.rejected:
            why = r.report.reasons[0] if r.report.reasons else ""
            print(f"rejected  {r.path}  step={r.report.step}  {r.report.verdict.value}: {why}")
        if found.report is not None:
            weights_only = "  (weights only: not an exact resume)"
            label = weights_only if found.report.exact_resume is False else ""
            print(f"LATEST VALID  {found.path}  step={found.report.step}{label}")
        else:
            print(f"no valid checkpoint under {args.root}")
    return 0 if found.path is not None else 1
