"""What every `ckpt-ha` command is built from: the parser class (a bad argument is one line,
exit 2; old spellings kept working unseen), and the argument types and flags several commands
share. Each command module adds its own commands with them (`register`); `ckpt_ha.cli.parser`
assembles the whole command line.

Imports nothing server-side: the whole parser is built before any command runs, also on the
light install."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from ckpt_ha.cli.errors import Handler

DISTRIBUTION = "ckpt-ha"

ACTOR_HELP = "who acts (default: $CKPT_HA_ACTOR, else the login name); recorded with the action"


class UsageError(Exception):
    """A bad argument: one line, exit 2."""


def version() -> str:
    """The installed distribution's version."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


class VersionAction(argparse.Action):
    """``--version``, reading the installed metadata only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        print(f"{parser.prog} {version()}")
        parser.exit()


class Parser(argparse.ArgumentParser):
    """A command of `ckpt-ha`: a bad argument raises `UsageError` (one line, exit 2) instead of
    printing usage; its sub-commands are added with `command` and old spellings with `alias`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hidden: list[str] = []
        """Old spellings of sub-commands: parsed as the command they name, never shown."""
        self._commands: argparse._SubParsersAction[Parser] | None = None

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def commands(self, *, dest: str = "action", required: bool = True) -> None:
        """Give this command sub-commands (`<noun> <verb>`); with ``required=False`` the noun
        alone is a command too (its own `handler`)."""
        self._commands = self.add_subparsers(dest=dest, required=required, parser_class=Parser)

    def command(self, name: str, help: str, handler: Handler | None = None, **kw: Any) -> Parser:
        """A sub-command, listed in help and completion; ``handler`` runs it (a noun whose verbs
        run has none)."""
        if self._commands is None:
            self.commands()
        assert self._commands is not None
        parser = self._commands.add_parser(name, help=help, **kw)
        if handler is not None:
            parser.set_defaults(handler=handler)
        return parser

    def alias(self, old: str, parser: Parser) -> None:
        """Keep an old spelling working: ``old`` parses exactly as ``parser`` (any command of
        the tree), and is neither listed in help nor offered by completion."""
        assert self._commands is not None, "an alias needs commands to sit among"
        if old in self._commands.choices:
            raise ValueError(f"{old!r} is already a command of {self.prog!r}")
        self._commands.choices[old] = parser
        self.hidden.append(old)

    def format_usage(self) -> str:
        with self._listing_shown_only():
            return super().format_usage()

    def format_help(self) -> str:
        with self._listing_shown_only():
            return super().format_help()

    @contextmanager
    def _listing_shown_only(self) -> Iterator[None]:
        """Usage lists the sub-commands without the old spellings. Only while formatting: an
        error message names the argument as before (`the following arguments are required:
        command`)."""
        if self._commands is None or not self.hidden:
            yield
            return
        shown = [name for name in self._commands.choices if name not in self.hidden]
        self._commands.metavar = "{" + ",".join(shown) + "}"
        try:
            yield
        finally:
            self._commands.metavar = None


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction[Any]]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the command line with the words that reach it (old spellings included),
    parents first."""
    found = [(path, parser)]
    for action in _subcommands(parser):
        for name, sub in action.choices.items():
            found += walk(sub, (*path, name))
    return found


def is_group(parser: argparse.ArgumentParser) -> bool:
    """A noun whose verb is required: its verbs run, it never does."""
    subs = _subcommands(parser)
    return bool(subs) and all(a.required for a in subs)


def text(value: str) -> str:
    """A non-empty, single-line argument (reasons and names end up in audit records)."""
    value = value.strip()
    if not value or any(c in value for c in "\r\n\x00"):
        raise argparse.ArgumentTypeError("must be non-empty text on one line")
    return value


def positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return number


def non_negative(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError("must be >= 0")
    return number


def count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return number


_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_AGE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def code(value: str) -> str:
    """A dead letter's error code (``max_deliver``, ``not_ready``): lower case and underscores."""
    if not _CODE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an error code (e.g. max_deliver)")
    return value


def since(value: str) -> datetime:
    """An ISO 8601 time (UTC unless it names a zone) or an age back from now (``30m``, ``2h``)."""
    age = _AGE.fullmatch(value.strip())
    if age is not None:
        return datetime.now(UTC) - timedelta(seconds=float(age.group(1)) * _UNIT_S[age.group(2)])
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither an ISO 8601 time nor an age such as 30m, 2h, 1d"
        ) from None
    when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    if when > datetime.now(UTC):
        raise argparse.ArgumentTypeError(f"{value!r} is in the future")
    return when


def needs_s3_endpoint(storage: str | None, env: dict[str, str]) -> None:
    """A drill on ``s3://`` runs against a local S3-compatible server the user started: without
    ``AWS_ENDPOINT_URL`` there is none to put the storage link in front of (`UsageError`)."""
    if storage and storage.startswith("s3://") and not env.get("AWS_ENDPOINT_URL"):
        raise UsageError(
            f"--storage {storage} needs AWS_ENDPOINT_URL set to a local S3-compatible server "
            "(e.g. http://127.0.0.1:9000) with the bucket created, and its credentials in "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
        )


def storage_root(value: str) -> str:
    """``s3://bucket/prefix``, ``file:///path`` or a local path (made absolute)."""
    parts = urlsplit(value)
    if parts.scheme == "s3":
        if not parts.netloc or any(c in value for c in " \r\n\x00"):
            raise argparse.ArgumentTypeError(f"{value!r} is not s3://bucket/prefix")
        return value.rstrip("/")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise argparse.ArgumentTypeError(f"{value!r} is not file:///absolute/path")
        return value
    if parts.scheme or not value.strip():
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither s3://bucket/prefix nor a local path"
        )
    return str(Path(value).expanduser().absolute())


STORAGE_HELP = (
    "the storage root of the stack: a local path or s3://bucket/prefix on the S3-compatible "
    "server of AWS_ENDPOINT_URL (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), "
    "reached through a storage link the storage-outage drill cuts"
)


def add_json(p: argparse.ArgumentParser) -> None:
    """`--json`, the same on every command that reports: stdout carries only the document."""
    p.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON document on stdout (progress and errors: stderr)",
    )


def add_progress(p: argparse.ArgumentParser) -> None:
    """`--progress` on long work: shown on stderr anyway when stderr is a terminal."""
    p.add_argument(
        "--progress",
        action="store_true",
        help="report progress on stderr even when it is not a terminal (it always is when it "
        "is one); never on stdout",
    )
