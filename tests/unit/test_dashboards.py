"""The Grafana dashboards are well-formed: every panel queries the provisioned datasource, ids
and uids are unique, the drill-down is templated on the job, key panels exist."""

from __future__ import annotations

import yaml

from tests.support.dashboards import DASHBOARDS, KEY_PANELS, dashboard_queries, dashboards

PROVISIONING = DASHBOARDS.parent / "provisioning"


def test_the_datasource_uid_the_panels_use_is_provisioned() -> None:
    (doc,) = [yaml.safe_load(p.read_text()) for p in (PROVISIONING / "datasources").glob("*.yml")]
    uids = {ds["uid"] for ds in doc["datasources"]}
    for name, dash in dashboards().items():
        for panel in dash["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] in uids, (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
            assert all(t["datasource"]["uid"] in uids for t in panel["targets"])


def test_dashboards_are_provisioned_from_files() -> None:
    (doc,) = [yaml.safe_load(p.read_text()) for p in (PROVISIONING / "dashboards").glob("*.yml")]
    assert [p["type"] for p in doc["providers"]] == ["file"]


def test_uids_and_panel_ids_are_unique_and_the_drill_down_is_templated() -> None:
    docs = dashboards()
    assert len({d["uid"] for d in docs.values()}) == len(docs) == 2
    for dash in docs.values():
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids)), dash["title"]
    job = docs["ckpt-ha-job.json"]
    assert [v["name"] for v in job["templating"]["list"]] == ["job"]
    assert all(
        'job_id="$job"' in q.expr for q in dashboard_queries() if q.dashboard == job["title"]
    )


def test_every_key_panel_exists_and_no_query_groups_by_checkpoint() -> None:
    queries = dashboard_queries()
    assert {(q.dashboard, q.panel) for q in queries} >= KEY_PANELS
    assert not [q for q in queries if "checkpoint_id" in q.expr]


def test_grafana_variables_are_all_substituted() -> None:
    for q in dashboard_queries():
        assert "$" not in q.promql(job="j"), q.expr
