"""The Grafana dashboards import anywhere: every panel queries the Prometheus picked by their
``datasource`` variable (no datasource uid, no default taken over), ids and uids are unique, the
drill-down is templated on a job every started job has, and the overview links to it (and it to
the job's traces)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from tests.support.dashboards import (
    DASHBOARDS,
    KEY_PANELS,
    dashboard_queries,
    dashboards,
    variable_queries,
)

PROVISIONING = DASHBOARDS.parent / "provisioning"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _datasources(node: Any) -> list[Any]:
    """Every ``datasource`` value anywhere in a dashboard."""
    if isinstance(node, dict):
        own = [node["datasource"]] if "datasource" in node else []
        return own + [d for v in node.values() for d in _datasources(v)]
    if isinstance(node, list):
        return [d for v in node for d in _datasources(v)]
    return []


def test_every_panel_queries_the_datasource_variable_never_a_uid() -> None:
    for name, dash in dashboards().items():
        (var,) = [v for v in dash["templating"]["list"] if v["name"] == "datasource"]
        assert (var["type"], var["query"]) == ("datasource", "prometheus"), name
        for panel in dash["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == DATASOURCE, (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
            assert all(t["datasource"] == DATASOURCE for t in panel["targets"])
        # Nothing else names a datasource either (variables included).
        assert all(d == DATASOURCE for d in _datasources(dash["templating"]) if d), name
        assert "ckpt-ha-prometheus" not in json.dumps(dash), name


def test_provisioning_takes_no_default_and_loads_files() -> None:
    (ds,) = [yaml.safe_load(p.read_text()) for p in (PROVISIONING / "datasources").glob("*.yml")]
    assert all(not d.get("isDefault") for d in ds["datasources"])
    assert all("uid" not in d for d in ds["datasources"])
    (doc,) = [yaml.safe_load(p.read_text()) for p in (PROVISIONING / "dashboards").glob("*.yml")]
    assert [p["type"] for p in doc["providers"]] == ["file"]


def test_uids_and_panel_ids_are_unique_and_the_drill_down_is_templated() -> None:
    docs = dashboards()
    assert len({d["uid"] for d in docs.values()}) == len(docs) == 2
    for dash in docs.values():
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids)), dash["title"]
    job = docs["ckpt-ha-job.json"]
    names = ["datasource", "cluster", "namespace", "job", "traces"]
    assert [v["name"] for v in job["templating"]["list"]] == names
    # Every query of both dashboards is narrowed to the chosen cluster and namespace ("All":
    # any, and series without them).
    for q in dashboard_queries():
        assert 'cluster=~"$cluster",namespace=~"$namespace"' in q.expr, q.expr
    assert all(
        'job_id="$job"' in q.expr for q in dashboard_queries() if q.dashboard == job["title"]
    )
    # Every started job, not only those with a valid checkpoint: the restore-coordinator sets
    # ckpt_ha_job_restarts_total to 0 at a job's first job.started.
    (var,) = [v for v in variable_queries() if v.name == "job"]
    assert (var.name, var.metric, var.label) == ("job", "ckpt_ha_job_restarts_total", "job_id")


def _links(dash: dict[str, Any]) -> list[str]:
    urls = [link["url"] for link in dash.get("links", [])]
    for panel in dash["panels"]:
        config = panel.get("fieldConfig", {})
        urls += [link["url"] for link in config.get("defaults", {}).get("links", [])]
        for override in config.get("overrides", []):
            for prop in override["properties"]:
                if prop["id"] == "links":
                    urls += [link["url"] for link in prop["value"]]
    return urls


def test_the_overview_links_to_the_job_view_and_the_job_view_to_its_traces() -> None:
    docs = dashboards()
    overview, job = docs["ckpt-ha-overview.json"], docs["ckpt-ha-job.json"]
    to_job = [u for u in _links(overview) if u.startswith(f"/d/{job['uid']}/")]
    # the dashboard link, and per-job panels (recovery point, restarts, firing alerts)
    assert len(to_job) >= 4, _links(overview)
    assert all("${datasource:queryparam}" in u for u in to_job)
    per_job = [u for u in to_job if "var-job=" in u]
    assert len(per_job) >= 3
    assert all("${__url_time_range}" in u for u in per_job)
    back = [u for u in _links(job) if u.startswith(f"/d/{overview['uid']}/")]
    assert back
    (traces,) = [u for u in _links(job) if u.startswith("/explore")]
    assert "${traces}" in traces
    assert "ckpt_ha.job_id" in traces
    assert "${job}" in traces


def test_alert_panels_show_only_ckpt_ha_alerts() -> None:
    alerts = [q for q in dashboard_queries() if "ALERTS" in q.expr]
    assert len(alerts) == 2
    assert all('app="ckpt-ha"' in q.expr for q in alerts)


def test_every_key_panel_exists_and_no_query_groups_by_checkpoint_or_the_scrape_job() -> None:
    queries = dashboard_queries()
    assert {(q.dashboard, q.panel) for q in queries} >= KEY_PANELS
    assert not [q for q in queries if "checkpoint_id" in q.expr]
    assert not [q for q in queries if 'job="' in q.expr]


def test_grafana_variables_are_all_substituted() -> None:
    for q in dashboard_queries():
        assert "$" not in q.promql(job="j"), q.expr


def test_every_documented_metric_is_on_a_dashboard_or_in_an_alert() -> None:
    """docs/OBSERVABILITY.md's metrics table names nothing an on-call engineer never sees."""
    root = DASHBOARDS.parents[2]
    doc = (root / "docs" / "OBSERVABILITY.md").read_text()
    table = doc[doc.index("<!-- metrics-table") : doc.index("<!-- end metrics-table")]
    documented = re.findall(r"^\| `(ckpt_ha_[a-z0-9_]+)`", table, re.MULTILINE)
    assert len(documented) > 50
    used = " ".join(q.expr for q in dashboard_queries())
    used += (root / "observability" / "alerts.yml").read_text()
    unused = [m for m in documented if not re.search(rf"{m}(_bucket|_count|_sum|_total)?\b", used)]
    assert unused == []


def test_per_job_panels_show_the_top_jobs_not_every_job() -> None:
    overview = dashboards()["ckpt-ha-overview.json"]
    for panel in overview["panels"]:
        for t in panel.get("targets", []):
            if "job_id" in t["expr"] and "ALERTS" not in t["expr"] and "count by" not in t["expr"]:
                assert t["expr"].startswith("topk("), (panel["title"], t["expr"])
