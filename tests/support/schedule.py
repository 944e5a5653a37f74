"""Longest first: how `--dist loadfile` hands the test files to pytest-xdist's workers.

xdist's own `loadfile` keeps a file's tests on one worker (its module-scoped set-up: a stack, an
image, a venv) but hands the files out by their number of tests, and gives a worker its next
file while it still has two tests to run. With files of very different lengths (a fault suite of
minutes beside files of seconds), a long file handed out late, or queued behind another one on a
busy worker while a second worker sits idle, sets the length of the whole run.

Here the files go out longest first (`EXPECTED_S`, seconds measured; a file not listed counts
`PER_TEST_S` a test), and a worker gets its next file only when it is down to its last test (it
needs the next test in hand to run its last one: xdist's worker runs a test once it knows the one
after it). Which tests run, and with what, is unchanged: only the order in which files reach
workers.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

PER_TEST_S = 3.0
"""What a test of a file not in `EXPECTED_S` is counted (most integration tests take ~1 s)."""

EXPECTED_S: dict[str, float] = {
    # tests/system: `pytest --durations` of a run with 2 workers (load 5-9), set-up included
    "tests/system/faults/test_faults.py": 400,
    "tests/system/faults/test_nats_outage.py": 235,
    "tests/system/faults/test_redis_frozen.py": 150,
    "tests/system/e2e/test_drills.py": 260,
    "tests/system/e2e/test_drills_torch.py": 290,
    "tests/system/e2e/test_drills_hang_hf.py": 350,
    "tests/system/e2e/test_image.py": 175,
    "tests/system/e2e/test_s3_drills.py": 170,
    "tests/system/e2e/test_runbook.py": 145,
    "tests/system/e2e/test_operator_alerts.py": 140,
    "tests/system/e2e/test_local_stack.py": 130,
    "tests/system/e2e/test_wheel.py": 120,
    "tests/system/e2e/test_paging.py": 90,
    "tests/system/e2e/test_s3_stack.py": 70,
    "tests/system/e2e/test_readme_snippets.py": 65,
    "tests/system/e2e/test_replicas.py": 50,
}


def expected_s(scope: str, tests: int) -> float:
    return EXPECTED_S.get(scope, PER_TEST_S * tests)


class LongestFirst(LoadFileScheduling):
    """`LoadFileScheduling` with the longest file first and no file queued ahead of time."""

    def _assign_work_unit(self, node: Any) -> None:
        scope = max(self.workqueue, key=lambda s: expected_s(s, len(self.workqueue[s])))
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(i) for i, done in work_unit.items() if not done])

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 1:
            return  # still two tests to go: the next file can wait for a worker to free up
        self._assign_work_unit(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") == "loadfile":
        return LongestFirst(config, log)
    return None
