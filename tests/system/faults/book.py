"""Where the faults' figures go: the test's output, pytest's terminal summary and a JSON file.

Each fault prints one line, ``FAULT <name>: written=N valid=N lost=0 doubled=0 stuck=0
converge_s=T.T``; the lines are repeated in the terminal summary and written as JSON to
``$CKPT_HA_FAULT_FIGURES`` (default: ``fault-figures.json`` in pytest's base temporary folder),
from which the reliability table of docs/RELIABILITY.md is made:
``python -m tests.system.faults.book FILE``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.system.faults.tally import Figures

FIGURES_ENV = "CKPT_HA_FAULT_FIGURES"
KEPT = pytest.StashKey[list[dict[str, Any]]]()
_PATH = pytest.StashKey[Path]()


def figures_path(config: pytest.Config) -> Path:
    if _PATH not in config.stash:
        given = os.environ.get(FIGURES_ENV)
        if given:
            path = Path(given)
        else:
            factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
            path = factory.getbasetemp() / "fault-figures.json"
        config.stash[_PATH] = path
    return config.stash[_PATH]


# The test report carries each fault's figures too: under pytest-xdist the controller, which
# prints the summary, keeps them from the reports the workers send (`Gatherer`).
PROPERTY = "fault_figures"


def keep(config: pytest.Config, entry: dict[str, Any]) -> None:
    kept = config.stash.setdefault(KEPT, [])
    kept[:] = [f for f in kept if f["fault"] != entry["fault"]] + [entry]
    path = figures_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept, indent=2) + "\n")


class Gatherer:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == PROPERTY:
                keep(self.config, value)


class FigureBook:
    def __init__(self, config: pytest.Config, node: pytest.Item | None = None) -> None:
        self.config = config
        self.node = node

    def record(self, figures: Figures) -> None:
        """Keep the figures, then assert nothing was lost, doubled or stuck."""
        print(figures.line(), flush=True)
        keep(self.config, figures.to_json())
        if self.node is not None:
            self.node.user_properties.append((PROPERTY, figures.to_json()))
        assert figures.lost == 0, figures.evidence["lost"]
        assert figures.doubled == 0, figures.evidence["doubled"]
        assert figures.stuck == 0, figures.evidence["stuck"]
        assert figures.converge_s is not None, "did not converge within the bound"


def summary(terminalreporter: Any, config: pytest.Config) -> None:
    kept = config.stash.get(KEPT, [])
    if not kept:
        return
    terminalreporter.section("fault figures")
    for entry in kept:
        terminalreporter.write_line(entry["line"])
    terminalreporter.write_line(f"(as JSON: {figures_path(config)})")


FAULTS = {
    "sigkill-writer-watcher": "writer-watcher SIGKILLed mid-flow, up again after 4 s",
    "sigkill-integrity-checker": "integrity-checker SIGKILLed mid-flow, up again after 4 s",
    "sigkill-registrar": "registrar SIGKILLed mid-flow, up again after 4 s",
    "sigkill-retention-janitor": "retention-janitor SIGKILLed mid-flow; the job's start "
    "(its tier) published while it is dead",
    "sigkill-restore-coordinator": "restore-coordinator SIGKILLed, then the training job; the "
    "failure waits 4 s for it; resumed exactly, once",
    "sigkill-registrar+integrity-checker": "registrar and integrity-checker SIGKILLed together",
    "duplicated-and-reordered-deliveries": "every event of a job delivered twice more, newest "
    "first; fresh checkpoints announced only out of order, twice",
    "nats-sigkill": "nats-server SIGKILLed mid-flow, started after 4 s on its port",
    "storage-down-during-write": "S3 gone for 20 s from a manifest's upload; the half-written "
    "checkpoint ends write_failed",
    "storage-down-during-verify": "S3 gone for the services for 20 s while the writer commits",
    "storage-down-during-quarantine-move": "S3 gone for 20 s from the first copy into "
    "quarantine/ of a damaged checkpoint; it ends quarantined, its bytes moved",
    "storage-down-during-delete": "S3 gone for 20 s from retention's first DELETE (rounds on a "
    "clock 2 days ahead); every expired checkpoint ends deleted",
    "redis-flushall-rebuild": "FLUSHALL, then the runbook's `registry rebuild`; every key "
    "compared with before",
    "redis-sigstop-120s": "redis-server frozen (SIGSTOP) for 2 minutes",
    "nats-outage-180s": "nats-server stopped for 3 minutes, started on its port; no service "
    "restarted",
    "stream-purged": "event stream deleted and provisioned again; `registry rebuild --clear` "
    "must refuse and change nothing",
}
"""What each fault does, for the table of docs/RELIABILITY.md."""


def table(kept: list[dict[str, Any]]) -> str:
    """The reliability table of docs/RELIABILITY.md from the figures' JSON."""
    lines = [
        "| fault | what happens | written | valid | lost | doubled | stuck | converge (s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for f in kept:
        took = "never" if f["converge_s"] is None else f"{f['converge_s']:.1f}"
        lines.append(
            f"| `{f['fault']}` | {FAULTS.get(f['fault'], '')} | {f['written']} | {f['valid']} "
            f"| {f['lost']} | {f['doubled']} | {f['stuck']} | {took} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
