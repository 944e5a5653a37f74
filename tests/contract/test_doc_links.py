"""Every relative link of the README and docs/ reaches a file, and its #anchor a heading or an
``<a id>`` there: facts live in one place and are linked, so a moved section must not leave a
dangling link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
BLOCK = re.compile(r"```.*?```", re.DOTALL)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
"""Code blocks and code spans: what they hold is not a link."""


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors (lower case, punctuation dropped, spaces as hyphens) and ids."""
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.+)$", BLOCK.sub("", text), re.MULTILINE):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


def broken(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(CODE.sub("", page.read_text())):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            out.append(f"{target}: no such anchor")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_the_page_resolves(page: Path) -> None:
    assert not broken(page)


def test_a_dangling_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "A.md").write_text("# Title\n\n## A part\n")
    page = tmp_path / "B.md"
    page.write_text("[ok](A.md#a-part) [gone](A.md#elsewhere) [none](C.md) `[x](#y)`\n")
    assert broken(page) == ["A.md#elsewhere: no such anchor", "C.md: no such file"]
