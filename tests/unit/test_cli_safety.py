"""Destructive commands ask first (or take `--yes`), and a user's `--sbatch-arg` never
overrides an option the Slurm adapter relies on."""

from __future__ import annotations

import argparse

import pytest

from ckpt_ha.cli.confirm import confirm
from ckpt_ha.cli.errors import Exit, NotConfirmed
from ckpt_ha.cli.parser import build_parser
from ckpt_ha.runner.slurm import AdapterInvariant, SlurmBatch, check_sbatch_args


def _args(yes: bool) -> argparse.Namespace:
    return argparse.Namespace(yes=yes)


def test_yes_goes_ahead_without_asking(capsys: pytest.CaptureFixture[str]) -> None:
    def never(_: str) -> str:
        raise AssertionError("asked although --yes")

    confirm(_args(True), ["would delete 3"], "delete 3?", ask=never, interactive=lambda: False)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("answer", ["y", "YES", " yes "])
def test_a_person_who_agrees_goes_ahead(answer: str, capsys: pytest.CaptureFixture[str]) -> None:
    confirm(_args(False), ["would delete 3"], "delete 3?", ask=lambda _: answer,
            interactive=lambda: True)  # fmt: skip
    out, err = capsys.readouterr()
    assert out == ""  # stdout keeps only the result
    assert err == "would delete 3\ndelete 3? [y/N] "


@pytest.mark.parametrize("answer", ["", "n", "no", "maybe"])
def test_anything_but_yes_does_nothing(answer: str) -> None:
    with pytest.raises(NotConfirmed, match="not confirmed: nothing done") as caught:
        confirm(_args(False), [], "delete 3?", ask=lambda _: answer, interactive=lambda: True)
    assert caught.value.code == Exit.CANCELLED == 5


def test_without_a_terminal_and_without_yes_nothing_is_done() -> None:
    with pytest.raises(NotConfirmed, match="pass --yes"):
        confirm(_args(False), [], "delete 3?", ask=lambda _: "y", interactive=lambda: False)


def test_the_destructive_commands_take_dry_run_and_yes() -> None:
    parser = build_parser()
    for argv in (["registry", "rebuild", "--clear"], ["reconcile", "--delete"],
                 ["dead-letters", "replay"]):  # fmt: skip
        args = parser.parse_args([*argv, "--dry-run", "--yes"])
        assert (args.dry_run, args.yes) == (True, True), argv


@pytest.mark.parametrize(
    ("arg", "option"),
    [
        ("--requeue", "requeue"),
        ("--requ", "requeue"),  # sbatch takes an unambiguous prefix
        ("--export=NONE", "export"),
        ("--output=/tmp/x", "output"),
        ("-o", "output"),
        ("-J", "job-name"),
        ("--wrap=sleep 1", "wrap"),
        ("--array=1-3", "array"),
        ("--partition=low", "partition"),
    ],
)
def test_an_option_the_adapter_sets_is_refused(arg: str, option: str) -> None:
    with pytest.raises(AdapterInvariant, match=f"would override --{option}"):
        check_sbatch_args(["--mem=1G", arg])
    with pytest.raises(AdapterInvariant):
        SlurmBatch(sbatch_args=[arg])


def test_other_options_pass_after_the_adapters_own() -> None:
    ok = ["--mem=4G", "--gres=gpu:1", "--no-requeue", "-N", "2", "--time=01:00:00"]
    check_sbatch_args(ok)
    argv = SlurmBatch(sbatch_args=ok).sbatch_argv(["python", "t.py"], {})
    assert argv[:3] == ["sbatch", "--parsable", "--no-requeue"]
    assert argv[-2:] == ["--wrap", "python t.py"]
    assert "--requeue" not in argv
