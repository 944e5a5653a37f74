"""What torchrun says about the rank that failed, and whether it restarts ranks itself (pure).

When one rank of a torchrun group fails, torchrun ends the others and exits 1 with a
``ChildFailedError`` banner: its own exit status and last stderr line are the same for every
failure. The rank's real cause is in two places, both read here:

* the "Root Cause (first observed failure)" section of that banner on stderr: the rank, and its
  exit code (negative: the signal that ended it). It is the only record of a rank that died by
  a signal: nothing can write an error file then;
* the error file torchrun writes when ``TORCHELASTIC_ERROR_FILE`` is set for it: a copy of the
  failing rank's own error file (with ``errorCode``, the rank's exit code), written only when
  that rank raised inside torchrun's ``@record`` decorator. Its message is the rank's exception.

Without an error file the rank's message is the last line torch prefixed with ``[rankN]:``
(it does so for an uncaught exception once the process group exists).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""Where torchrun (its ``@record``-decorated main) writes the root-cause failure as JSON."""
MAX_RESTARTS_ENV = "PET_MAX_RESTARTS"
"""torchrun reads ``--max-restarts`` from this variable when the option is not given."""
NPROC_ENV, NNODES_ENV = "PET_NPROC_PER_NODE", "PET_NNODES"
"""torchrun's environment defaults for ``--nproc-per-node`` and ``--nnodes``."""
MESSAGE_CHARS = 500

_ROOT_CAUSE = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)")
_BORDER = re.compile(r"^\s*={3,}\s*$")
_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_MAX_RESTARTS = ("--max-restarts", "--max_restarts")
_FLAGS = frozenset(
    {
        "--standalone",
        "-m",
        "--module",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
    }
)
"""torchrun's options that take no value (every other one takes one)."""


@dataclass(frozen=True)
class RankFailure:
    """The rank torchrun blamed for ending the group (its first observed failure)."""

    rank: int | None
    """The global rank; None when only the error file said a rank failed."""
    exit_code: int | None
    """The rank's exit status; None when a signal ended it."""
    signal: int | None
    message: str = ""
    """The rank's own error line (its exception), "" when it left none."""


@dataclass(frozen=True)
class ErrorRecord:
    """What torchrun's error file says about the failed rank."""

    message: str
    """The rank's exception (its first line), "" when the file holds none."""
    exit_code: int
    """The rank's exit code as torchrun saw it (negative: the signal that ended it)."""


def rank_failure(stderr_tail: Sequence[str], recorded: ErrorRecord | None) -> RankFailure | None:
    """The failing rank from torchrun's stderr (its last lines) and its error file, or None when
    neither is torchrun's report of a failed rank (a plain command, torchrun itself killed or
    failing before it started the ranks)."""
    rank, code = _root_cause(stderr_tail)
    if code is None and recorded is not None:
        code = recorded.exit_code
    if code is None:
        return None
    message = recorded.message if recorded is not None else ""
    if not message and rank is not None:
        message = _prefixed_line(stderr_tail, rank)
    message = message[:MESSAGE_CHARS]
    if code < 0:
        return RankFailure(rank, None, -code, message)
    return RankFailure(rank, code, None, message)


def parse_error_file(text: str) -> ErrorRecord | None:
    """The error file torchrun writes for a failed rank, or None when the text is not one:
    garbled, another shape, or a process's own exception (no ``errorCode``: torchrun failing by
    itself, or a plain command decorated with ``@record``)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    body = doc.get("message") if isinstance(doc, dict) else None
    if not isinstance(body, dict):
        return None
    code = body.get("errorCode")
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    message = body.get("message")
    extra = body.get("extraInfo")
    stack = extra.get("py_callstack") if isinstance(extra, dict) else None
    line = _first_line(message) if isinstance(message, str) else ""
    if not line and isinstance(stack, str):
        line = _last_line(stack)
    return ErrorRecord(line, code)


def _option(args: Sequence[str], names: Sequence[str], default: str | None) -> str | None:
    """The value of torchrun option ``names`` in ``args`` (its own options, before the script)."""
    value = default
    i = 0
    while i < len(args) and args[i].startswith("-"):  # torchrun's options end at the script
        name, eq, inline = args[i].partition("=")
        takes_value = not eq and name not in _FLAGS
        if name in names:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
        i += 2 if takes_value else 1
    return value


def max_restarts(command: Sequence[str], env: Mapping[str, str]) -> int | None:
    """torchrun's ``--max-restarts`` for ``command`` (0 when not given), or None when the command
    is not torchrun (``torchrun …`` or ``python -m torch.distributed.run …``)."""
    args = _torchrun_args(command)
    if args is None:
        return None
    value = _option(args, _MAX_RESTARTS, env.get(MAX_RESTARTS_ENV))
    try:
        return max(int(value or 0), 0)
    except ValueError:
        return 0


def world_size(command: Sequence[str], env: Mapping[str, str]) -> int | None:
    """Processes torchrun starts in all: ``--nproc-per-node`` times ``--nnodes`` (1 each when not
    given); None when the command is not torchrun or either is not a fixed number (``auto``,
    an elastic ``MIN:MAX`` range): then only the job knows its world size."""
    args = _torchrun_args(command)
    if args is None:
        return None
    nproc = _option(args, ("--nproc-per-node", "--nproc_per_node"), env.get(NPROC_ENV)) or "1"
    nnodes = _option(args, ("--nnodes",), env.get(NNODES_ENV)) or "1"
    low, _, high = nnodes.partition(":")
    if high and high != low:
        return None
    try:
        total = int(nproc) * int(low)
    except ValueError:
        return None
    return total if total >= 1 else None


def _torchrun_args(command: Sequence[str]) -> Sequence[str] | None:
    if not command:
        return None
    program = PurePath(command[0]).name
    if program == "torchrun":
        return command[1:]
    if program.startswith("python") and "-m" in command[1:-1]:
        at = command.index("-m", 1)
        if command[at + 1] in _MODULES:
            return command[at + 2 :]
    return None


def _root_cause(lines: Sequence[str]) -> tuple[int | None, int | None]:
    """(rank, exit code) from the last root-cause section in ``lines``."""
    starts = [i for i, line in enumerate(lines) if line.strip() == _ROOT_CAUSE]
    if not starts:
        return None, None
    found: dict[str, int] = {}
    for line in lines[starts[-1] + 1 :]:
        if _BORDER.match(line):
            break
        match = _FIELD.match(line)
        if match and match.group(1) not in found:
            found[match.group(1)] = int(match.group(2))
    return found.get("rank"), found.get("exitcode")


def _prefixed_line(lines: Sequence[str], rank: int) -> str:
    prefix = f"[rank{rank}]:"
    for line in reversed(lines):
        text = line.strip()
        if text.startswith(prefix) and text[len(prefix) :].strip():
            return text[len(prefix) :].strip()
    return ""


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
