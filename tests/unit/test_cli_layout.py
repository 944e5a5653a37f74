"""The CLI as composition root: every parsed command reaches exactly one handler, and nothing in
the operations layer prints. (Which package may import which — runtime no service, drill and
ops no CLI, ops no argparse or os — is checked by `lint-imports`, contracts in pyproject.toml.)"""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

import ckpt_ha.ops
from ckpt_ha.cli import render
from ckpt_ha.cli.main import COMMANDS, command_module
from ckpt_ha.cli.parser import build_parser
from ckpt_ha.cli.serve import entries
from ckpt_ha.runtime.catalog import SERVICE_NAMES


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _parsed_commands() -> set[tuple[str, str | None]]:
    found: set[tuple[str, str | None]] = set()
    for name, parser in _subcommands(build_parser()).items():
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if actions:
            found |= {(name, action) for action in _subcommands(parser)}
        if not actions or not actions[0].required:  # the noun alone is a command too
            found.add((name, None))
    return found


def test_every_parsed_command_has_one_handler_and_every_handler_a_command() -> None:
    assert set(COMMANDS) == _parsed_commands()
    for (command, action), (module, function) in COMMANDS.items():
        handler = getattr(importlib.import_module(command_module(module)), function, None)
        assert callable(handler), (command, action, module, function)


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
