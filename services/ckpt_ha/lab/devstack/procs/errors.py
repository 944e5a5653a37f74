"""The errors of starting, watching and stopping private infrastructure processes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class ProcsError(Exception):
    """Base class for process-management failures."""


class BinaryNotFound(ProcsError):
    """A server binary shipped by a Python package could not be located."""

    def __init__(self, binary: str, searched: Sequence[Path]) -> None:
        self.binary = binary
        self.searched = tuple(searched)
        where = ", ".join(str(p) for p in self.searched) or "nowhere"
        super().__init__(f"{binary} binary not found (searched: {where}; also not on PATH)")


class ProcessStartFailed(ProcsError):
    """A process died or never became ready; ``log_tail`` holds the end of its log."""

    def __init__(self, name: str, reason: str, log_tail: str) -> None:
        self.name = name
        self.reason = reason
        self.log_tail = log_tail
        message = f"{name} failed to start: {reason}"
        if log_tail:
            message += f"\n--- last lines of its log ---\n{log_tail}"
        super().__init__(message)


class ProcessNotRunning(ProcsError):
    """A signal was requested for a process that is gone (or whose pid now belongs to another)."""

    def __init__(self, name: str, pid: int, action: str) -> None:
        self.name = name
        self.pid = pid
        self.action = action
        super().__init__(f"cannot {action} {name}: pid {pid} is not that process any more")
