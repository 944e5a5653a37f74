"""What verifying a checkpoint concluded, and why. Pure data: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.formats import limits


class Verdict(StrEnum):
    VALID = "valid"
    CORRUPT = "corrupt"
    """Present but wrong: sizes, checksums or structure do not match what the format declares."""
    INCOMPLETE = "incomplete"
    """The format's commit evidence is missing or names files that are not there."""
    UNSAFE = "unsafe"
    """Hostile content: paths leaving the checkpoint, symlinks out, code in a pickle."""
    UNKNOWN = "unknown"
    """No recognised layout: can be tracked, never valid without integrity evidence."""


# A worse verdict wins when several checks fail.
_SEVERITY = [Verdict.VALID, Verdict.UNKNOWN, Verdict.INCOMPLETE, Verdict.CORRUPT, Verdict.UNSAFE]


@dataclass
class Report:
    format: CheckpointFormat
    verdict: Verdict = Verdict.VALID
    step: int | None = None
    reasons: list[str] = field(default_factory=list)
    checksums: dict[str, str] = field(default_factory=dict)
    """File (relative path) → ``algorithm:hex``, as computed while verifying."""
    checks: list[str] = field(default_factory=list)
    """Checks that ran and passed, e.g. ``sizes``, ``checksums:xxh3_64``, ``safetensors-header``."""
    bytes_read: int = 0
    exact_resume: bool | None = None
    notes: list[str] = field(default_factory=list)
    """Findings that change no verdict but a human should see (files no commit file lists)."""

    def fail(self, verdict: Verdict, reason: str) -> None:
        """Record a failed check; the report keeps the most severe verdict.

        At most `limits.MAX_REASONS` reasons are kept, then one saying more were found, each
        cut at `limits.MAX_REASON_CHARS` characters: a hostile file cannot make the verdict
        (and the event carrying it) grow without bound."""
        if _SEVERITY.index(verdict) > _SEVERITY.index(self.verdict):
            self.verdict = verdict
        if len(self.reasons) > limits.MAX_REASONS:
            return
        if len(self.reasons) == limits.MAX_REASONS:
            reason = f"more failed checks not listed (limit {limits.MAX_REASONS})"
        elif len(reason) > limits.MAX_REASON_CHARS:
            reason = f"{reason[: limits.MAX_REASON_CHARS - 3]}..."
        self.reasons.append(reason)

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.VALID

    def to_json(self) -> dict[str, object]:
        return {
            "verdict": self.verdict.value,
            "format": self.format.value,
            "step": self.step,
            "reasons": self.reasons,
            "checks": self.checks,
            "checksums": self.checksums,
            "bytes_read": self.bytes_read,
            "exact_resume": self.exact_resume,
            "notes": self.notes,
        }
