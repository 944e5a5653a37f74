"""The offline `ckpt-ha` commands, `verify` and `latest-valid`: a verdict from the files alone, no
NATS, Redis or services.

They need only the base install (no `server` extra), so a training image or a laptop with the
light SDK can still check a checkpoint folder: this module imports nothing server-side. Both take
a local path or an `s3://bucket/prefix` URI (boto3 is then needed: the `s3` extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ckpt_ha.cli import progress, render


def cmd_verify(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    """Exit 0 valid, 1 anything else; a location that holds nothing, or S3 that cannot be
    read, is a usage error (2)."""
    from ckpt_ha.ops.offline import NothingThere, verify_location
    from ckpt_ha.storage import NeedsS3Extra, StorageError

    try:
        with progress.reporting(args, f"verify {args.path}", "bytes") as tick:
            report = verify_location(args.path, args.checksum, tick)
    except (NothingThere, StorageError, NeedsS3Extra) as exc:
        print(f"ckpt-ha: {_one_line(exc, args.path)}", file=sys.stderr)
        return 2
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
    """Exit 0 when a valid checkpoint exists, 1 when none does, 2 for a missing root (or S3
    that cannot be read)."""
    from ckpt_ha.ops.offline import NothingThere, newest_valid
    from ckpt_ha.storage import NeedsS3Extra, StorageError

    try:
        with progress.reporting(args, f"latest-valid {args.root}", "folders checked") as tick:
            found = newest_valid(args.root, tick)
    except (NothingThere, StorageError, NeedsS3Extra) as exc:
        print(f"ckpt-ha: {_one_line(exc, args.root)}", file=sys.stderr)
        return 2
    if args.json:
        doc = {
            "path": found.path,
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


def _one_line(exc: Exception, location: str) -> str:
    text = " ".join(str(exc).split())
    return text if text.startswith(location) else f"{location}: {text}"
