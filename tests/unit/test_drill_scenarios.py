"""The drill scenarios, one module each: the registry the CLI and `drill.run` read."""

from __future__ import annotations

import inspect

import pytest

from ckpt_ha.cli.main import UsageError, build_parser
from ckpt_ha.lab.drill import scenarios
from ckpt_ha.lab.drill.scenarios import EXPECTED_ALERTS, FAULTS, SCENARIOS


def test_every_cli_scenario_has_a_module_in_the_order_all_runs_them() -> None:
    names = ["node-exit", "storage-outage", "corrupt-checkpoint", "storage-lost", "restart-loop",
             "env-mismatch", "torchrun-dcp", "hf-trainer", "hang", "reshard"]  # fmt: skip
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
               scenarios.storage_lost, scenarios.restart_loop, scenarios.env_mismatch,
               scenarios.hang, scenarios.reshard, scenarios.slurm_node_lost]  # fmt: skip
    for module in modules:
        assert SCENARIOS[module.NAME] is module.run
        assert inspect.iscoroutinefunction(module.run)
        assert FAULTS[module.NAME] == module.FAULT
        assert module.FAULT
        assert module.__doc__


def test_pages_expected_per_scenario() -> None:
    assert EXPECTED_ALERTS == {"corrupt-checkpoint": "CkptHaCheckpointCorrupt",
                               "restart-loop": "CkptHaRestartLoop"}  # fmt: skip
