"""The restricted unpickler refuses pickle memory bombs in bounded memory, measured in a child
process of its own (the other bounds: tests/unit/test_restricted_pickle.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_ha.formats import limits
from tests.unit.test_restricted_pickle import P4

REPO = Path(__file__).resolve().parents[2]


PAIRS = (limits.MAX_METADATA_BYTES - 8) // 2
BOMBS = {
    "dict-bomb": lambda: P4 + b"]" + b"}a" * PAIRS + b".",
    "list-bomb": lambda: P4 + b"]" + b"]a" * PAIRS + b".",
    "memo-bomb": lambda: P4 + b"Nr\xff\xff\xff\x3f.",
    "none-stream": lambda: P4 + b"N0" * PAIRS + b"N.",
}
"""64 MiB .metadata files (what the size limit lets through), and one of 8 bytes."""


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_pickle_memory_bomb_is_refused_in_bounded_memory(tmp_path: Path, bomb: str) -> None:
    """`ckpt-ha verify`'s path on a DCP folder whose ``.metadata`` is a memory bomb, in a process
    limited to 1 GiB of address space: a verdict naming the limit, well under that memory.
    Before, the unpickler ran into the limit (MemoryError) and used all of it."""
    folder = tmp_path / "step-1"
    folder.mkdir()
    (folder / ".metadata").write_bytes(BOMBS[bomb]())
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))\n"
        "from pathlib import Path\n"
        "from ckpt_ha.formats import verify_path\n"
        "report = verify_path(Path(sys.argv[1]))\n"
        "status = Path('/proc/self/status').read_text()\n"
        "rss = int(status.split('VmHWM:')[1].split()[0]) * 1024\n"
        "print(report.verdict.value, rss, report.reasons[0], sep='|')\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'services'}{os.pathsep}{REPO / 'contracts'}"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script, str(folder)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    verdict, rss, reason = result.stdout.strip().split("|", 2)
    assert verdict == "corrupt", reason
    assert "MemoryError" not in reason
    assert "limit" in reason, reason
    assert int(rss) < 400 * 2**20, f"peak RSS {int(rss) >> 20} MiB"
    # A guard against a parse that never ends, not a speed target (bench/ has those): alone it
    # takes a few seconds; beside the other integration workers on 2 cores up to about 35.
    assert elapsed < 90, f"{elapsed:.1f} s"
