"""The drill scenarios, one module each, in the order ``ckpt-ha drill --scenario all`` runs them.

A scenario module has ``NAME`` (its ``--scenario`` value), ``FAULT`` (the one variable it
changes), ``EXPECTED_ALERT`` (the page it must raise, or None), optionally ``REQUIRES`` (the
Python packages its training job needs: the framework drills need the torch / hf extras) and
``async def run(drill)`` returning its JSON result, and optionally ``IN_ALL = False`` to stay out
of ``--scenario all`` (a drill needing a system package ``scripts/bootstrap`` does not install:
``slurm-node-lost``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any

from ckpt_ha.lab.drill.harness import Drill
from ckpt_ha.lab.drill.scenarios import (
    corrupt_checkpoint,
    env_mismatch,
    hang,
    hf_trainer,
    node_exit,
    reshard,
    restart_loop,
    slurm_node_lost,
    storage_lost,
    storage_outage,
    torchrun_dcp,
)

_MODULES = (
    node_exit, storage_outage, corrupt_checkpoint, storage_lost, restart_loop, env_mismatch,
    torchrun_dcp, hf_trainer, hang, reshard, slurm_node_lost,
)  # fmt: skip

SCENARIOS: dict[str, Callable[[Drill], Coroutine[Any, Any, dict[str, Any]]]] = {
    m.NAME: m.run for m in _MODULES
}
FAULTS: dict[str, str] = {m.NAME: m.FAULT for m in _MODULES}
"""The one variable each drill changes; everything else is the baseline."""
EXPECTED_ALERTS: dict[str, str] = {
    m.NAME: m.EXPECTED_ALERT for m in _MODULES if m.EXPECTED_ALERT is not None
}
"""The page each scenario must raise (checked when the stack runs Prometheus)."""
IN_ALL: tuple[str, ...] = tuple(m.NAME for m in _MODULES if getattr(m, "IN_ALL", True))
"""What ``--scenario all`` runs, in order."""
REQUIRES: dict[str, tuple[str, ...]] = {m.NAME: getattr(m, "REQUIRES", ()) for m in _MODULES}
"""Python packages a scenario's training job needs beyond the base install (an extra)."""


def missing_packages(scenario: str) -> list[str]:
    """What this installation lacks to run ``scenario`` (empty: it can run)."""
    return [name for name in REQUIRES[scenario] if importlib.util.find_spec(name) is None]


__all__ = ["EXPECTED_ALERTS", "FAULTS", "IN_ALL", "REQUIRES", "SCENARIOS", "missing_packages"]
