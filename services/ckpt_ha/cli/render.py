"""How results look to people: aligned tables, sizes, durations, checkpoint rows. `--json`
output is built next to each command from the same results."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckpt_ha.core.records import CheckpointRecord


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def record_rows(records: Sequence[CheckpointRecord], tier: str = "-") -> str:
    return table(
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


def transition(record: CheckpointRecord) -> str:
    """The last change of a record: who moved it from which state to which, when and why."""
    last = record.history[-1]
    was = record.history[-2].state.value if len(record.history) > 1 else "-"
    return (
        f"{record.checkpoint_id}: {was} -> {record.state.value}"
        f" by {last.actor} at {last.at.isoformat()}: {last.reason}"
    )


def size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds:.0f} s ({seconds / 60:.1f} min)"
    return f"{seconds:.0f} s ({seconds / 3600:.2f} h)"


def dumps(doc: Any) -> str:
    """The `--json` form of every command."""
    return json.dumps(doc, indent=2)
