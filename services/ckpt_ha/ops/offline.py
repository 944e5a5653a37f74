"""Offline verdicts on checkpoint folders, without the stack: the newest valid checkpoint under a
run's root, and why each newer one was rejected."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_ha.formats import Report, latest_valid
from ckpt_ha.storage import FsStore


@dataclass(frozen=True)
class Rejected:
    path: Path
    report: Report

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "step": self.report.step,
            "verdict": self.report.verdict.value,
            "reasons": self.report.reasons[:5],
        }


@dataclass(frozen=True)
class LatestValid:
    root: Path
    path: Path | None
    """None: no valid checkpoint under the root."""
    report: Report | None
    rejected: list[Rejected]
    """Newer than the chosen one (or every one, when none is valid), newest first."""


def newest_valid(root: Path) -> LatestValid:
    chosen, reports = latest_valid(FsStore(root))
    rejected: list[Rejected] = []
    for folder, report in reports:
        if folder == chosen:
            break
        rejected.append(Rejected(root / folder, report))
    chosen_report = dict(reports).get(chosen) if chosen else None
    return LatestValid(root, root / chosen if chosen else None, chosen_report, rejected)
