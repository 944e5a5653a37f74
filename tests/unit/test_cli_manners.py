"""CLI manners: `--version`, shell completion run in a real bash, progress on stderr only when
stderr is a terminal or `--progress` asks (never in `--json` output), `--json` on every command
that reports, help without requirement ids, and bad arguments as one line with exit 2."""

from __future__ import annotations

import io

import pytest

from ckpt_ha.cli import completion, jobs, serve
from ckpt_ha.cli.arguments import walk
from ckpt_ha.cli.main import main
from ckpt_ha.cli.parser import build_parser
from ckpt_ha.cli.progress import Progress
from ckpt_ha.lab import cli as lab_cli

NO_JSON = {
    serve.cmd_serve: "runs a service until stopped",
    jobs.cmd_run: "runs the training command; its exit code is the result",
    lab_cli.cmd_demo: "a guided tour for people",
    completion.cmd_completion: "prints a shell script",
}
"""Commands (by handler) without `--json`, and why: they run something or print a script, they
do not report a result."""


def test_every_command_that_reports_takes_json() -> None:
    """Every parser of the tree that runs something (old spellings and nouns that run alone
    included) takes `--json`, unless it is one of the few that report nothing."""
    commands = [(path, p) for path, p in walk(build_parser()) if p.get_default("handler")]
    assert len(commands) > 40
    assert set(NO_JSON) <= {p.get_default("handler") for _, p in commands}
    lacking = [
        path
        for path, parser in commands
        if parser.get_default("handler") not in NO_JSON
        and not any("--json" in a.option_strings for a in parser._actions)
    ]
    assert lacking == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["completion", "fish"], "invalid choice: 'fish'"),
        (["verify", "x", "--checksum", "md5"], "invalid choice: 'md5'"),
        (["latest-valid"], "the following arguments are required: root"),
        (["registry", "rebuild", "--progress=yes"], "ignored explicit argument"),
        (["streams", "check", "--jsn"], "unrecognized arguments"),
        ([], "the following arguments are required: command"),
        (["checkpoints"], "the following arguments are required: action"),
        (["bogus"], "argument command: invalid choice: 'bogus'"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("ckpt-ha: ")
    assert says in err


def test_completion_follows_the_parser() -> None:
    """A new command appears in the script without anyone editing it."""
    parser = build_parser()
    nodes = {n.path: n for n in completion.nodes(parser)}
    assert set(nodes) == {path for path, _ in walk(parser)}
    assert nodes[("checkpoint", "list")].valued["--job"] == []
    assert "fenced" in nodes[("checkpoint", "list")].valued["--state"]


# -- progress -------------------------------------------------------------------------------


def test_progress_is_throttled_names_phases_and_ends_with_one_line() -> None:
    now = [0.0]
    out = io.StringIO()
    p = Progress("reconcile", "jobs read", out, tty=False, clock=lambda: now[0])
    p(1, 3)
    p(2, 3)  # within the interval: not shown
    now[0] = 5.0
    p(3, 3)
    p(10, None, "objects listed")  # a new phase always shows
    p.close()
    assert out.getvalue().splitlines() == [
        "reconcile: 1 of 3 jobs read (33%)",
        "reconcile: 3 of 3 jobs read (100%)",
        "reconcile: 10 objects listed",
        "reconcile: done, 10 objects listed",
    ]


def test_progress_on_a_terminal_rewrites_one_line_and_clears_it() -> None:
    out = io.StringIO()
    p = Progress("verify x", "bytes", out, tty=True, clock=lambda: 0.0)
    p(0, 3 * 1024 * 1024)
    p.close()
    assert out.getvalue() == "\rverify x: 0 B of 3.0 MiB read (0%)\x1b[K\r\x1b[K"
