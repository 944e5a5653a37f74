"""Modules of one concern: no product module is over 500 lines unless the allow-list says why.

A long module is usually several jobs in one file; splitting it by concern keeps each change
small. The allow-list is short and every entry carries its reason; an entry that no longer needs
its place (the module shrank) fails too, so the list only ever gets shorter.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 500

# module path (relative to the repository) -> why it may stay longer than LIMIT
ALLOWED: dict[str, str] = {}


def _modules() -> dict[str, int]:
    sizes = {}
    for top in ("services", "contracts"):
        for path in (ROOT / top).rglob("*.py"):
            with path.open(encoding="utf-8") as text:
                sizes[path.relative_to(ROOT).as_posix()] = sum(1 for _ in text)
    return sizes


def test_no_module_is_over_the_limit_unless_allowed_with_a_reason() -> None:
    over = {
        name: lines
        for name, lines in sorted(_modules().items())
        if lines > LIMIT and name not in ALLOWED
    }
    assert not over, f"split these by concern (over {LIMIT} lines): {over}"


def test_every_allowed_module_still_needs_its_place_and_says_why() -> None:
    sizes = _modules()
    for name, why in ALLOWED.items():
        assert why.strip(), f"{name} is allowed without a reason"
        assert sizes.get(name, 0) > LIMIT, f"{name} is no longer over {LIMIT} lines: drop it"
