"""What a command is, how it fails, and the one table of exit codes every command keeps, kept
apart from `context` (which builds server-side clients) so that the offline commands run on the
light install."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from enum import IntEnum
from pathlib import Path

Handler = Callable[[argparse.Namespace, dict[str, str], Path], int]
"""A command: its parsed arguments, the environment, the ckpt-ha home; returns the exit code."""


class Exit(IntEnum):
    """Every command's exit codes: one table (docs/CLI.md, generated from `MEANING`), so that a
    script tells a negative answer from a failure, and a failure from an unreachable platform."""

    OK = 0
    NO = 1
    USAGE = 2
    UNREACHABLE = 3
    FAILED = 4
    CANCELLED = 5
    ESCALATED = 6
    INTERRUPTED = 130


MEANING: dict[Exit, str] = {
    Exit.OK: "done; the answer is yes (valid, found, healthy, nothing left over)",
    Exit.NO: "the command worked and the answer is no: `verify` not valid, `latest-valid` "
    "none, `reconcile` unknown objects remain, `status` something not ready, `policy advise` "
    "unworkable, a checkpoint or job not found; `run`: the job failed and was not resumed",
    Exit.USAGE: "a bad argument, or one that does not fit the configuration: an unknown or "
    "half-set context, endpoints half from the environment, an unreadable secret, a missing "
    "extra",
    Exit.UNREACHABLE: "a dependency could not be reached: NATS, Redis or the storage (S3 "
    "unreadable, a listing that failed); nothing was changed, or the line says what was",
    Exit.FAILED: "refused or failed: the registry or a service refused the act (an illegal "
    "transition, `registry rebuild` while the registry's writers run, a stream not as "
    "required), or it was not confirmed in time; `run`: no resume plan within `--plan-timeout`",
    Exit.CANCELLED: "cancelled by a person: a destructive command not confirmed (answer no, or "
    "no terminal and no `--yes`); `run`: the attempt was cancelled (`scancel`, `job stop`)",
    Exit.ESCALATED: "`run` only: automatic recovery stopped (`resume.escalated`); the reason "
    "and the runbook step are on stderr",
    Exit.INTERRUPTED: "interrupted (Ctrl-C); `run` also exits 128+N when stopped by signal N",
}


class CommandError(Exception):
    """A failure to report in one line; its exit code is ``code`` (`Exit.FAILED` unless the
    raiser says otherwise: `Exit.NO` for a lookup that found nothing)."""

    code: Exit = Exit.FAILED

    def __init__(self, message: str, code: Exit | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class Unreachable(CommandError):
    """NATS, Redis or the storage could not be reached (`Exit.UNREACHABLE`)."""

    code = Exit.UNREACHABLE


class NotConfirmed(CommandError):
    """A destructive command the person did not confirm (`Exit.CANCELLED`)."""

    code = Exit.CANCELLED
