"""The Grafana dashboards' queries, read from observability/grafana/dashboards/*.json."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARDS = Path(__file__).resolve().parents[2] / "observability" / "grafana" / "dashboards"

KEY_PANELS = {
    ("ckpt-ha overview", "Lifecycle funnel"),
    ("ckpt-ha overview", "Corrupt checkpoints by reason"),
    ("ckpt-ha overview", "Quarantined"),
    ("ckpt-ha overview", "Recovery point per job"),
    ("ckpt-ha overview", "Resume outcomes"),
    ("ckpt-ha overview", "Time to recover (failure → stage), mean"),
    ("ckpt-ha overview", "Escalations by reason"),
    ("ckpt-ha overview", "Restarts per job (restart loops)"),
    ("ckpt-ha overview", "Bytes verified"),
    ("ckpt-ha overview", "Replication lag by tier"),
    ("ckpt-ha overview", "Services up"),
    ("ckpt-ha overview", "Messages by outcome"),
    ("ckpt-ha overview", "Consumer lag (pending + unacked)"),
    ("ckpt-ha overview", "faststream: processed messages"),
    ("ckpt-ha overview", "JetStream storage"),
    ("ckpt-ha job", "Recovery point"),
    ("ckpt-ha job", "Newest valid checkpoint committed"),
    ("ckpt-ha job", "Last progress"),
    ("ckpt-ha job", "Restarts and failures"),
    ("ckpt-ha job", "Resume outcomes (last time each was reached)"),
    ("ckpt-ha job", "Newest corrupt checkpoint (step)"),
}
"""Panels that must show data after a corrupt-checkpoint and a restart-loop drill (for the
drill-down: on the corrupt-checkpoint drill's job)."""

GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$cluster": ".*",
    "$namespace": ".*",
}
"""What Grafana puts in place of its variables (``cluster`` and ``namespace`` as "All")."""


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    expr: str

    @property
    def key(self) -> bool:
        return (self.dashboard, self.panel) in KEY_PANELS

    def promql(self, *, job: str) -> str:
        """The expression as Grafana would send it, for the drill-down's job ``job``."""
        expr = self.expr
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        return expr.replace("$job", job)


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_queries() -> list[PanelQuery]:
    return [
        PanelQuery(doc["title"], panel["title"], target["expr"])
        for doc in dashboards().values()
        for panel in _panels(doc["panels"])
        for target in panel.get("targets", [])
    ]


@dataclass(frozen=True)
class VariableQuery:
    """A query variable of a dashboard: Grafana's ``label_values(METRIC, LABEL)``."""

    dashboard: str
    name: str
    metric: str
    label: str

    def promql(self) -> str:
        """What Grafana asks Prometheus for these values, as an instant query."""
        return f"group by ({self.label}) ({self.metric})"


_LABEL_VALUES = re.compile(r"label_values\(\s*([^,]+?)\s*,\s*(\w+)\s*\)")


def variable_queries() -> list[VariableQuery]:
    found = []
    for doc in dashboards().values():
        for var in doc["templating"]["list"]:
            if var["type"] != "query":
                continue
            match = _LABEL_VALUES.fullmatch(var["query"]["query"])
            assert match, (doc["title"], var["name"], var["query"])
            found.append(VariableQuery(doc["title"], var["name"], match[1], match[2]))
    return found
