"""Where the faults' figures go: the test's output, pytest's terminal summary and a JSON file.

Each fault prints one line, ``FAULT <name>: written=N valid=N lost=0 doubled=0 stuck=0
converge_s=T.T``; the lines are repeated in the terminal summary and written as JSON to
``$CKPT_HA_FAULT_FIGURES`` (default: ``fault-figures.json`` in pytest's base temporary folder),
from which the README's reliability table is made.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.faults.tally import Figures

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


class FigureBook:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def record(self, figures: Figures) -> None:
        """Keep the figures, then assert nothing was lost, doubled or stuck."""
        print(figures.line(), flush=True)
        kept = self.config.stash.setdefault(KEPT, [])
        kept[:] = [f for f in kept if f["fault"] != figures.name] + [figures.to_json()]
        path = figures_path(self.config)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(kept, indent=2) + "\n")
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
