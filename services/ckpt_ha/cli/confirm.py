"""The manners of a destructive command (`registry rebuild --clear`, `reconcile --delete`,
`dead-letters replay`): `--dry-run` shows what it would do and does nothing; otherwise it shows
the same and asks, unless `--yes`. Without a terminal to ask on and without `--yes` it does
nothing (exit 5): a script says `--yes` on purpose, never by accident.

Imports nothing server-side (the parser is built on the light install)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ckpt_ha.cli.errors import NotConfirmed


def add_confirmation(p: argparse.ArgumentParser, *, dry_run: bool = True) -> None:
    """`--dry-run` (unless the command has its own) and `--yes`."""
    if dry_run:
        p.add_argument(
            "--dry-run", action="store_true", help="show what it would do, and do nothing"
        )
    p.add_argument(
        "--yes",
        action="store_true",
        help="do it without asking (needed when stdin is not a terminal)",
    )


def confirm(
    args: argparse.Namespace,
    what: Sequence[str],
    question: str,
    *,
    ask: Callable[[str], str] = input,
    interactive: Callable[[], bool] = lambda: sys.stdin.isatty(),
) -> None:
    """Return when the person agreed (or said `--yes`); else `NotConfirmed` (exit 5). ``what``
    (what would happen) and the question go to stderr: stdout keeps only the result."""
    if getattr(args, "yes", False):
        return
    for line in what:
        print(line, file=sys.stderr)
    if not interactive():
        raise NotConfirmed(f"{question} not confirmed: nothing done (no terminal to ask on; "
                           "pass --yes, or --dry-run to see what it would do)")  # fmt: skip
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = ask("")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise NotConfirmed(f"{question} not confirmed: nothing done")
