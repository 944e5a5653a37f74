"""The CLI as composition root: every parsed command reaches exactly one handler, and nothing in
the operations layer prints. (Which package may import which — runtime no service, drill and
ops no CLI, ops no argparse or os — is checked by `lint-imports`, contracts in pyproject.toml.)"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import pytest

import ckpt_ha.ops
from ckpt_ha.cli import render
from ckpt_ha.cli.arguments import Parser, is_group, walk
from ckpt_ha.cli.parser import COMMAND_MODULES, build_parser, registrars
from ckpt_ha.cli.serve import entries
from ckpt_ha.runtime.catalog import SERVICE_NAMES


def test_every_parsed_command_has_one_handler_and_every_handler_a_command() -> None:
    used: set[object] = set()
    for path, parser in walk(build_parser())[1:]:
        handler = parser.get_default("handler")
        if is_group(parser):  # a noun: its verbs run, it never does
            assert handler is None, path
        else:  # a command: the one function its module registered for it
            assert callable(handler), path
            used.add(handler)
    # The product's modules and any an installed distribution adds (the `ckpt_ha.cli` group).
    modules = [sys.modules[register.__module__] for register in registrars()]
    assert set(COMMAND_MODULES) <= set(modules)
    defined = {
        f
        for module in modules
        for name, f in inspect.getmembers(module, inspect.isfunction)
        if name.startswith("cmd_") and f.__module__ == module.__name__
    }
    assert defined - used == set()  # every handler a command
    assert {h.__module__ for h in used} == {m.__name__ for m in modules}


def test_the_command_modules_are_the_parser_s_and_distributions_may_add_theirs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One place adds a command: the module's `register`; an installed distribution adds its
    own modules through the `ckpt_ha.cli` entry-point group."""
    product = [m.register for m in COMMAND_MODULES]
    assert registrars()[: len(product)] == product

    class Entry:
        def load(self) -> object:
            def register(top: Parser) -> None:
                top.command("extra", help="a command from outside", handler=lambda *_: 0)

            return register

    def entry_points(group: str) -> list[Entry]:
        assert group == "ckpt_ha.cli"
        return [Entry()]

    monkeypatch.setattr("importlib.metadata.entry_points", entry_points)
    assert build_parser().parse_args(["extra"]).handler(None, {}, Path()) == 0


def test_old_spellings_parse_as_the_command_they_name_and_stay_out_of_help() -> None:
    parser = build_parser()
    help_text = parser.format_help()
    listed = set(re.findall(r"^    (\S+)", help_text, re.MULTILINE))
    [usage] = set(re.findall(r"\{([^}]*)\}", help_text))
    assert (
        listed
        == set(usage.split(","))
        == {"checkpoint", "job", "stack", "service", "status"} | listed
    )
    for old, new in [
        (["serve", "registrar"], ["service", "run", "registrar"]),
        (["up"], ["stack", "up"]),
        (["down", "--json"], ["stack", "down", "--json"]),
        (["demo"], ["stack", "demo"]),
        (["drill", "--scenario", "all"], ["stack", "drill", "--scenario", "all"]),
        (["checkpoints", "list", "--job", "j"], ["checkpoint", "list", "--job", "j"]),
        (["verify", "/x"], ["checkpoint", "verify", "/x"]),
        (["latest-valid", "/x"], ["checkpoint", "latest-valid", "/x"]),
        (["quarantine", "c", "--reason", "r"], ["checkpoint", "quarantine", "c", "--reason", "r"]),
        (["release", "c", "--reason", "r"], ["checkpoint", "release", "c", "--reason", "r"]),
        (["pin", "c", "--by", "b"], ["checkpoint", "pin", "c", "--by", "b"]),
        (["unpin", "c", "--by", "b"], ["checkpoint", "unpin", "c", "--by", "b"]),
        (["streams", "check"], ["stream", "check"]),
        (["restores", "--job", "j"], ["restore", "list", "--job", "j"]),
        (["dead-letters", "--limit", "5"], ["dead-letter", "list", "--limit", "5"]),
        (["dead-letters", "replay", "--dry-run"], ["dead-letter", "replay", "--dry-run"]),
        (["audit", "--job", "j"], ["retention", "audit", "--job", "j"]),
        (["reconcile"], ["retention", "reconcile"]),
        (["run", "--job", "j", "--", "true"], ["job", "run", "--job", "j", "--", "true"]),
    ]:
        before, after = vars(parser.parse_args(old)), vars(parser.parse_args(new))
        for key in ("command", "action"):  # the words typed; everything else the same
            before.pop(key, None), after.pop(key, None)
        before.pop("since", None), after.pop("since", None)
        assert before == after, old
        assert old[0] not in listed
    assert parser.parse_args(["serve", "registrar"]).default_log_level == "INFO"
    assert not hasattr(parser.parse_args(["stack", "status"]), "default_log_level")
    # `status` is the product's own now (any deployment); the local stack's processes are
    # `stack status`.
    assert parser.parse_args(["status"]).handler.__module__ == "ckpt_ha.cli.status"


def test_the_serve_table_names_exactly_the_services_the_stack_starts() -> None:
    assert tuple(entries()) == SERVICE_NAMES


def test_operations_never_print() -> None:
    ops = Path(ckpt_ha.ops.__file__).parent
    printing = [
        p.name
        for p in ops.glob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"
    ]
    assert printing == []


def test_tables_align_columns_and_sizes_and_spans_read_well() -> None:
    assert render.table(["A", "LONG"], [("xyz", 1), ("q", "")]).splitlines() == [
        "A    LONG",
        "xyz  1",
        "q",
    ]
    assert [render.size(n) for n in (None, 512, 2048, 3 * 1024**4, 5 * 1024**5)] == [
        "-", "512 B", "2.0 KiB", "3.0 TiB", "5120.0 TiB",
    ]  # fmt: skip
    assert [render.span(s) for s in (90, 600, 7200)] == [
        "90.0 s", "600 s (10.0 min)", "7200 s (2.00 h)",
    ]  # fmt: skip
