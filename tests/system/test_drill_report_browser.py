"""The HTML drill report as a person sees it: rendered by a real headless browser (Debian's
chromium, installed by ``scripts/chromium-tools``), screenshotted and its DOM dumped.

The report comes from built results (no drill runs). The screenshot must be a PNG of the window's
size with enough ink on it (not a blank or an error page) including the colours of the verdicts;
the DOM chromium built must hold one summary row per scenario, the five levels of each, and no
JSON in any evidence cell. Without chromium the test fails (never skips).
"""

from __future__ import annotations

import os
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest

from ckpt_ha.lab.drill import report
from tests.unit.test_drill_report import (
    LEVELS,
    Cells,
    escalated_result,
    not_run_result,
    stored_result,
)

ROOT = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 1000, 1400


def chromium() -> str:
    """The chromium binary, installed through ``scripts/chromium-tools`` when missing; the test
    fails when there is none (under CI=true the script itself fails)."""
    done = subprocess.run([str(ROOT / "scripts" / "chromium-tools")], capture_output=True,
                          text=True, timeout=900, check=False)  # fmt: skip
    path = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not path:
        pytest.fail(f"chromium unavailable (scripts/chromium-tools): {done.stderr[-1500:]}")
    return path


def headless(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             f"--user-data-dir={profile}", "--force-device-scale-factor=1"]  # fmt: skip
    env = {**os.environ, "HOME": str(profile)}
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=90,
                          check=False, env=env)  # fmt: skip


def png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Width, height and RGB pixels of an 8-bit, non-interlaced RGB or RGBA PNG (what chromium
    writes), decoded with the standard library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert (depth, interlace) == (8, 0), (depth, interlace)
    channels = {2: 3, 6: 4}[colour]
    raw, stride = zlib.decompress(idat), width * channels
    rows: list[bytearray] = []
    prev = bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xFF
        rows.append(line)
        prev = line
    pixels = [(r[i], r[i + 1], r[i + 2]) for r in rows for i in range(0, stride, channels)]
    return width, height, pixels


def test_the_html_report_renders_in_a_headless_browser(tmp_path: Path) -> None:
    binary = chromium()
    results = [stored_result(), stored_result("corrupt-checkpoint", "fail"), escalated_result(),
               not_run_result()]  # fmt: skip
    page = tmp_path / "report.html"
    page.write_text(report.page(results), encoding="utf-8")
    url = page.as_uri()

    shot = tmp_path / "report.png"
    done = headless(binary, tmp_path / "profile", f"--window-size={WIDTH},{HEIGHT}",
                    f"--screenshot={shot}", url)  # fmt: skip
    assert shot.exists(), done.stderr[-2000:]
    width, height, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    colours = Counter(pixels)
    background, _ = colours.most_common(1)[0]
    assert background == (255, 255, 255)
    ink = sum(n for colour, n in colours.items() if colour != background) / len(pixels)
    assert ink > 0.03, f"only {ink:.1%} of the screenshot is not background: a blank page?"
    # The verdict colours made it to the screen: green PASS, red FAIL (the summary table, the
    # checks) and the drill's loss curves.
    green = sum(n for (r, g, b), n in colours.items() if g > 100 and g > r + 50 and g > b + 30)
    red = sum(n for (r, g, b), n in colours.items() if r > 150 and r > g + 90 and r > b + 90)
    assert green > 50, green
    assert red > 50, red

    done = headless(binary, tmp_path / "profile", "--dump-dom", url)
    dom = done.stdout
    assert "</html>" in dom, done.stderr[-2000:]
    cells = Cells()
    cells.feed(dom)
    assert dom.count('<tr class="scenario">') == len(results)
    for r in results:
        assert f'<a href="#{r["scenario"]}">{r["scenario"]}</a>' in dom
    with_levels = [r for r in results if r["levels"]]
    assert dom.count('<tr class="level">') == len(LEVELS) * len(with_levels)
    assert cells.evidence, "no evidence cell in the rendered page"
    for text in cells.evidence:
        assert "{" not in text, text
        assert "}" not in text, text
    assert cells.results.count("not expected") == 1
