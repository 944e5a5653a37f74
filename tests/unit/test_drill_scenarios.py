"""The drill scenarios, one module each: the registry the CLI and `drill.run` read."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from ckpt_ha.cli.main import UsageError, build_parser
from ckpt_ha.lab.drill import scenarios
from ckpt_ha.lab.drill.scenarios import EXPECTED_ALERTS, FAULTS, SCENARIOS


def test_every_cli_scenario_has_a_module_in_the_order_all_runs_them() -> None:
    names = ["node-exit", "storage-outage", "corrupt-checkpoint", "restart-loop", "env-mismatch",
             "torchrun-dcp", "hf-trainer"]  # fmt: skip
    assert list(SCENARIOS) == [*names, "slurm-node-lost"]
    assert list(FAULTS) == list(SCENARIOS)
    # Slurm is not installed by scripts/bootstrap: `all` (the README's main command) leaves it out.
    assert list(scenarios.IN_ALL) == names
    names.append("slurm-node-lost")
    args = build_parser().parse_args(["drill", "--scenario", "all"])
    assert args.scenario == "all"
    for name in names:
        assert build_parser().parse_args(["drill", "--scenario", name]).scenario == name
    with pytest.raises(UsageError, match="invalid choice"):
        build_parser().parse_args(["drill", "--scenario", "no-such-drill"])


def test_each_scenario_module_declares_its_name_fault_alert_and_run() -> None:
    modules = [scenarios.node_exit, scenarios.storage_outage, scenarios.corrupt_checkpoint,
               scenarios.restart_loop, scenarios.env_mismatch,
               scenarios.slurm_node_lost]  # fmt: skip
    for module in modules:
        assert SCENARIOS[module.NAME] is module.run
        assert inspect.iscoroutinefunction(module.run)
        assert FAULTS[module.NAME] == module.FAULT
        assert module.FAULT
        assert module.__doc__


def test_pages_expected_per_scenario() -> None:
    assert EXPECTED_ALERTS == {"corrupt-checkpoint": "CheckpointCorrupt",
                               "restart-loop": "RestartLoop"}  # fmt: skip


def test_a_framework_drill_names_what_it_needs_and_all_says_so_when_it_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--scenario all` on an installation without the hf extra runs the other drills and says
    plainly why the framework one did not run (never a silent skip, never a failure)."""
    from ckpt_ha.lab.drill import run as drill_run
    from ckpt_ha.lab.drill import scenarios

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
