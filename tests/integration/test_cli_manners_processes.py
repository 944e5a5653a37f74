"""CLI manners seen from outside the process: `--version`, shell completion run in a real bash and
zsh, progress on stderr only when stderr is a terminal or `--progress` asks (never in `--json`
output), help without requirement ids (the parser-only manners: tests/unit/test_cli_manners.py)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_ha.cli import completion
from ckpt_ha.cli.arguments import walk
from ckpt_ha.cli.parser import build_parser, version
from tests.support.hostile import write_native


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_no_help_output_names_a_requirement_id() -> None:
    tree = walk(build_parser())
    assert len(tree) > 30
    for path, parser in tree:
        text = parser.format_help()
        assert not re.search(r"\(R\d+", text), (path, text)
    assert not re.search(r"\(R\d+", _cli("--help").stdout)


def test_version_is_the_installed_distribution_s() -> None:
    done = _cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"ckpt-ha {version()}\n"
    assert done.stderr == ""


# -- completion -----------------------------------------------------------------------------

_BASH_TRY = """
eval "$(cat "$1")" || exit 3
complete -p ckpt-ha || exit 4
try() {
    COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMPREPLY=()
    _ckpt_ha || exit 5
    echo "${COMPREPLY[*]}"
}
try ckpt-ha ""
try ckpt-ha checkpoint ""
try ckpt-ha checkpoint list --st
try ckpt-ha checkpoint list --state v
try ckpt-ha checkpoint list --job list ""
try ckpt-ha service run reg
try ckpt-ha checkpoint latest-valid --
try ckpt-ha completion ""
try ckpt-ha job run --job j -- pyth
try ckpt-ha ch
try ckpt-ha checkpoints ""
try ckpt-ha serve reg
try ckpt-ha latest-valid --
try ckpt-ha run --job j -- pyth
"""


def test_bash_completion_completes_commands_options_and_choices_in_a_real_bash(
    tmp_path: Path,
) -> None:
    bash = shutil.which("bash")
    assert bash is not None, "bash is needed to test the completion script"
    generated = _cli("completion", "bash")
    assert generated.returncode == 0, generated.stderr
    script = tmp_path / "ckpt-ha.bash"
    script.write_text(generated.stdout)
    done = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", _BASH_TRY, "try", str(script)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0] == "complete -o default -F _ckpt_ha ckpt-ha"
    parser = build_parser()
    top = [path[0] for path, _ in walk(parser) if len(path) == 1 and path[0] not in parser.hidden]
    assert lines[1].split() == top
    verbs = ["list", "show", "verify", "latest-valid", "quarantine", "release", "pin", "unpin"]
    assert lines[2].split() == verbs
    assert lines[3] == "--state"
    assert lines[4] == "valid"
    assert lines[5] == ""  # after an option's value: nothing fixed, file names (-o default)
    assert lines[6] == "registrar"
    assert set(lines[7].split()) == {"--help", "--json", "--progress"}
    assert lines[8].split() == ["bash", "zsh"]
    assert lines[9] == ""  # after `--`: the training command's own words
    assert lines[10] == "checkpoint"  # an old spelling is never offered (`checkpoints`)...
    assert lines[11:] == [" ".join(verbs), "registrar", lines[7], ""]  # ...but followed, typed


_ZSH_TRY = """
autoload -U compinit && compinit -u -D || exit 3
eval "$(cat "$1")" || exit 4
print -r -- "${_comps[ckpt-ha]}"
# What zsh's _bash_complete does on a TAB: the bash function, in sh emulation (0-based arrays).
try() {
    COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMPREPLY=()
    _ckpt_ha || exit 5
    echo "${COMPREPLY[*]}"
}
emulate sh -c 'try ckpt-ha checkpoint ""'
emulate sh -c 'try ckpt-ha verify x --checksum ""'
"""


def test_the_zsh_script_loads_in_a_real_zsh_through_bashcompinit(tmp_path: Path) -> None:
    zsh = shutil.which("zsh")
    assert zsh is not None, "zsh is needed to test its completion script (apt-get install zsh)"
    generated = _cli("completion", "zsh")
    assert generated.returncode == 0, generated.stderr
    head, _, body = generated.stdout.partition("autoload -U +X bashcompinit && bashcompinit\n")
    assert head.startswith("#compdef ckpt-ha\n")
    assert body == completion.bash()
    script = tmp_path / "ckpt-ha.zsh"
    script.write_text(generated.stdout)
    done = subprocess.run(
        [zsh, "-f", "-c", _ZSH_TRY, "try", str(script)],
        capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "HOME": str(tmp_path), "ZDOTDIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "_bash_complete -o default -F _ckpt_ha",
        "list show verify latest-valid quarantine release pin unpin",
        "xxh3_64 sha256",
    ]


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    write_native(root / "step-10", step=10)
    write_native(root / "step-20", step=20)
    return root


def test_verify_progress_goes_to_stderr_and_json_stays_one_document(run_root: Path) -> None:
    folder = str(run_root / "step-20")
    asked = _cli("verify", folder, "--json", "--progress")
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["verdict"] == "valid"
    lines = asked.stderr.splitlines()
    assert lines[0].startswith(f"verify {folder}: 0 B of ")
    assert re.fullmatch(rf"verify {re.escape(folder)}: done, 5\.0 KiB read", lines[-1]), lines

    unasked = _cli("verify", folder, "--json")  # stderr is a pipe: nothing
    assert unasked.returncode == 0
    assert unasked.stderr == ""
    assert unasked.stdout == asked.stdout


def test_latest_valid_counts_folders_and_only_on_stderr(run_root: Path) -> None:
    done = _cli("latest-valid", str(run_root), "--json", "--progress")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["path"] == f"{run_root}/step-20"
    assert done.stderr.splitlines()[-1] == f"latest-valid {run_root}: done, 2 folders checked"
    assert f"latest-valid {run_root}: 1 of 2 folders checked (50%)" in done.stderr


def test_progress_shows_on_its_own_when_stderr_is_a_terminal(run_root: Path) -> None:
    main_fd, term_fd = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckpt_ha.cli.main", "latest-valid", str(run_root), "--json"],
            stdout=subprocess.PIPE, stderr=term_fd, env=os.environ,
        )  # fmt: skip
        os.close(term_fd)
        out, _ = proc.communicate(timeout=60)
        seen = b""
        while select.select([main_fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(main_fd, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(main_fd)
    assert proc.returncode == 0
    assert json.loads(out)["path"] == f"{run_root}/step-20"
    text = seen.decode()
    assert f"\rlatest-valid {run_root}: 1 of 2 folders checked (50%)\x1b[K" in text
    assert text.endswith("\r\x1b[K")  # cleared: the terminal is left clean
