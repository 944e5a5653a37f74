"""The framework drill names the packages it needs (this tier installs them; the fast tier runs
without them). The rest of the scenario registry: tests/unit/test_drill_scenarios.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_ha.lab.drill import scenarios


def test_a_framework_drill_names_what_it_needs_and_all_says_so_when_it_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--scenario all` on an installation without the hf extra runs the other drills and says
    plainly why the framework one did not run (never a silent skip, never a failure)."""
    from ckpt_ha.lab.drill import run as drill_run

    assert scenarios.REQUIRES["hf-trainer"] == ("torch", "transformers", "accelerate")
    assert scenarios.REQUIRES["node-exit"] == ()
    assert scenarios.missing_packages("hf-trainer") == []  # the test command installs the extra
    monkeypatch.setitem(scenarios.REQUIRES, "hf-trainer", ("no_such_framework_pkg",))
    logged: list[str] = []
    result = drill_run._run_or_say_why(
        "hf-trainer",
        tmp_path,
        None,
        logged.append,
        60.0,
        "6/6 ",  # type: ignore[arg-type]
    )
    assert result["verdict"] == drill_run.NOT_RUN
    assert "no_such_framework_pkg" in result["reasons"][0]
    assert "scripts/bootstrap --frameworks" in result["reasons"][0]
    assert logged == [f"[6/6 hf-trainer] {result['reasons'][0]}"]
