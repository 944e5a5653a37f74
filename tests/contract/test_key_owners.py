"""Each Redis key space has one owning module that formats its keys: no other module under
services/ names a service's key space in its code (docstrings and comments may describe it).

The key spaces come from each service's ``access.py`` (`RedisUser.key_spaces`), so a service
that adds one must name its owner here, and every other module is checked against it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

from ckpt_ha.integrity_checker import access as integrity_checker
from ckpt_ha.registrar import access as registrar
from ckpt_ha.restore_coordinator import access as restore_coordinator
from ckpt_ha.restore_coordinator import api as restores
from ckpt_ha.retention_janitor import access as retention_janitor
from ckpt_ha.retention_janitor import store as janitor_store
from ckpt_ha.writer_watcher import access as writer_watcher
from ckpt_ha.writer_watcher import adapters as watcher_state

SERVICES = Path(__file__).resolve().parents[2] / "services"
ACCESS: tuple[ModuleType, ...] = (
    writer_watcher,
    integrity_checker,
    registrar,
    restore_coordinator,
    retention_janitor,
)

OWNERS: dict[str, ModuleType] = {
    "-watcher:": watcher_state,
    restores.KEY_SPACE: restores,
    "janitor:": janitor_store,
}
"""The text that starts a key space after the prefix, and the one module that formats it."""

PENDING: dict[str, frozenset[str]] = {
    # The coordinator's lease and `heard` key spaces, which a registry dump skips
    # (`RegistryKeys.is_transient`): the registry cannot import the coordinator; to be declared
    # by the coordinator's store and passed in.
    restores.KEY_SPACE: frozenset({"ckpt_ha/registry/keys.py"}),
}
"""Modules that still name a key space they do not own, each with why (keep this short)."""


def _marker(pattern: str, prefix: str) -> str:
    """``P-watcher:*`` → ``-watcher:``; ``P:coord:plan:*`` → ``coord:``."""
    rest = pattern.removeprefix(prefix)
    lead = ":" if rest.startswith(":") else ""
    head = rest.removeprefix(lead).split(":", 1)[0]
    return (head if lead else rest.split(":", 1)[0]) + ":"


def _code_strings(tree: ast.AST) -> list[str]:
    """Every string constant of the code (f-string parts included), but docstrings."""
    docstrings = {
        id(body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and (body := node.body)
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_every_service_key_space_names_its_owner() -> None:
    markers = {
        _marker(pattern, "P")
        for access in ACCESS
        for pattern in access.REDIS.key_spaces("P").values()
    }
    assert markers, "no service declares a key space"
    assert markers <= set(OWNERS), markers - set(OWNERS)


def test_the_marker_of_a_pattern() -> None:
    assert _marker(writer_watcher.key_spaces("P")["watcher-state"], "P") == "-watcher:"
    assert _marker(restore_coordinator.key_spaces("P")["restore-state"], "P") == "coord:"
    assert _marker(retention_janitor.key_spaces("P")["janitor-view"], "P") == "janitor:"


def test_no_module_but_the_owner_formats_a_service_key() -> None:
    found: list[str] = []
    for path in sorted(SERVICES.rglob("*.py")):
        name = path.relative_to(SERVICES).as_posix()
        strings = _code_strings(ast.parse(path.read_text(), name))
        for marker, owner in OWNERS.items():
            if path == Path(str(owner.__file__)).resolve() or name in PENDING.get(marker, ()):
                continue
            found += [f"{name}: {s!r}" for s in strings if marker in s]
    assert not found, "a service's key formatted outside its owner:\n" + "\n".join(found)


def test_the_check_sees_a_key_in_code_not_in_a_docstring() -> None:
    tree = ast.parse('"""<p>-watcher:* is described"""\nKEY = f"{p}-watcher:{root}"\n')
    assert [s for s in _code_strings(tree) if "-watcher:" in s] == ["-watcher:"]
