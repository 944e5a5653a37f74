"""The runner's own watch over a torchrun group's ranks (issue 28), its pure part: a zombie's
exit status and a rank from an environment (tests/integration/test_runner_adapter.py watches
real processes)."""

from __future__ import annotations

import signal
from pathlib import Path

from ckpt_ha.runner.rankwatch import RankDeath, RankWatch, describe, exit_signal, rank_of


def _stat(state: str, exit_code: int) -> str:
    rest = ["0"] * 46 + [str(exit_code)]
    return f"12 (python3 (x)) {state} 1 2 " + " ".join(rest)


def test_a_zombies_exit_status_gives_the_signal_only_for_a_death_by_a_signal() -> None:
    assert exit_signal(_stat("Z", signal.SIGKILL)) == signal.SIGKILL
    assert exit_signal(_stat("Z", signal.SIGTERM | 0x80)) == signal.SIGTERM  # core dumped
    assert exit_signal(_stat("Z", 3 << 8)) is None  # exit 3: torchrun's report says why
    assert exit_signal(_stat("Z", 0)) is None
    assert exit_signal(_stat("S", signal.SIGKILL)) is None  # alive
    assert exit_signal("12 (x) Z 1") is None  # an old kernel without the field
    assert rank_of(b"PATH=/bin\0RANK=3\0LOCAL_RANK=1\0") == 3
    assert rank_of(b"GROUP_RANK=2\0") is None
    assert describe(RankDeath(5, 1, signal.SIGKILL)) == "rank 1 ended by SIGKILL"
    assert describe(RankDeath(5, None, 100)) == "a rank (pid 5) ended by signal 100"


def test_a_child_first_seen_before_its_exec_still_gets_its_rank(tmp_path: Path) -> None:
    """Between fork and exec a child shows torchrun's environment (no RANK); once dead, none:
    the rank read later, while it runs, is the one its death is reported with."""
    root = Path(tmp_path)
    (root / "10" / "task" / "10").mkdir(parents=True)
    (root / "10" / "task" / "10" / "children").write_text("11")
    child = root / "11"
    child.mkdir()
    child.joinpath("environ").write_bytes(b"PATH=/bin\0")
    child.joinpath("stat").write_text(_stat("S", 0))
    watch = RankWatch(10, root=root)
    assert watch.poll() is None
    assert watch.ranks == {11: None}
    child.joinpath("environ").write_bytes(b"PATH=/bin\0RANK=1\0")
    assert watch.poll() is None
    child.joinpath("environ").write_bytes(b"")
    child.joinpath("stat").write_text(_stat("Z", signal.SIGKILL))
    assert watch.poll() == RankDeath(11, 1, signal.SIGKILL)
