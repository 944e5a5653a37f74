"""deploy/k8s/ against what a platform team's admission policies check (the usual rules of
Kyverno's or Gatekeeper's baseline and restricted sets), offline: non-root, no privilege
escalation, every capability dropped, a read-only root filesystem, requests and limits, probes,
no API token, a ServiceAccount of its own; and the rest of a hardened deployment: one
PodDisruptionBudget and a spread over nodes per service, NetworkPolicies that deny by default and
admit /metrics from the monitoring namespace only, settings whose change rolls the pods, and the
labels kube-prometheus-stack selects by."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ckpt_ha.runtime.catalog import SERVICE_NAMES
from tests.support.k8s import K8S, Doc, pod_spec, render

BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "example"
WORKLOADS = ("Deployment", "CronJob")


@pytest.fixture(scope="module", params=[BASE, OVERLAY], ids=["base", "overlay"])
def docs(request: pytest.FixtureRequest) -> list[Doc]:
    rendered: list[Doc] = render(request.param)
    return rendered


def kind(docs: list[Doc], name: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == name]


def workloads(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] in WORKLOADS]


def pod_labels(doc: Doc) -> dict[str, str]:
    template = doc["spec"]["template"] if doc["kind"] == "Deployment" else None
    if template is None:
        template = doc["spec"]["jobTemplate"]["spec"]["template"]
    labels: dict[str, str] = template["metadata"]["labels"]
    return labels


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, selector  # no expressions here
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_every_pod_runs_restricted(docs: list[Doc]) -> None:
    assert len(workloads(docs)) == len(SERVICE_NAMES) + 1
    for doc in workloads(docs):
        name = doc["metadata"]["name"]
        pod = pod_spec(doc)
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True, name
        assert context["runAsUser"] != 0, name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod["automountServiceAccountToken"] is False, name
        assert "hostNetwork" not in pod, name
        assert "hostPID" not in pod, name
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert "privileged" not in sc, name
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), (name, bound)
            image = container["image"]
            assert ":" in image.rsplit("/", 1)[-1], image  # a tag, never an implicit latest
            assert not image.endswith(":latest"), image
        # What a read-only root leaves writable is mounted: the home and /tmp.
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert {"/var/lib/ckpt-ha", "/tmp"} <= mounts, name


def test_every_service_is_probed(docs: list[Doc]) -> None:
    for doc in kind(docs, "Deployment"):
        container = pod_spec(doc)["containers"][0]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert container[probe]["httpGet"]["port"] == "http", (doc["metadata"]["name"], probe)


def test_each_workload_has_a_service_account_of_its_own(docs: list[Doc]) -> None:
    accounts = {d["metadata"]["name"]: d for d in kind(docs, "ServiceAccount")}
    used = [pod_spec(d)["serviceAccountName"] for d in workloads(docs)]
    assert len(set(used)) == len(used)  # one per workload, no sharing
    assert "default" not in used
    for name in used:
        assert accounts[name]["automountServiceAccountToken"] is False, name


def test_the_irsa_component_gives_each_service_its_role(docs: list[Doc]) -> None:
    accounts = {d["metadata"]["name"]: d for d in kind(docs, "ServiceAccount")}
    for service in SERVICE_NAMES:
        annotations = accounts[f"ckpt-ha-{service}"]["metadata"].get("annotations", {})
        if not kind(docs, "Namespace"):  # the base: no cloud assumed
            assert annotations == {}
        else:
            role = annotations["eks.amazonaws.com/role-arn"]
            assert role.endswith(f":role/ckpt-ha-{service}"), role


def test_a_drain_leaves_every_service_running_and_replicas_spread(docs: list[Doc]) -> None:
    budgets = kind(docs, "PodDisruptionBudget")
    for doc in kind(docs, "Deployment"):
        labels = pod_labels(doc)
        (budget,) = [b for b in budgets if selects(b["spec"]["selector"], labels)]
        assert budget["spec"]["maxUnavailable"] == 1
        assert doc["spec"]["replicas"] >= 2
        spread = {c["topologyKey"]: c for c in pod_spec(doc)["topologySpreadConstraints"]}
        host = spread["kubernetes.io/hostname"]
        assert (host["maxSkew"], host["whenUnsatisfiable"]) == (1, "DoNotSchedule")
        assert selects(host["labelSelector"], labels)
        assert selects(spread["topology.kubernetes.io/zone"]["labelSelector"], labels)


def test_network_policies_deny_by_default_and_admit_metrics_from_monitoring(
    docs: list[Doc],
) -> None:
    policies = kind(docs, "NetworkPolicy")
    for doc in workloads(docs):
        labels = pod_labels(doc)
        mine = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
        types = {t for p in mine for t in p["spec"]["policyTypes"]}
        assert types == {"Ingress", "Egress"}, doc["metadata"]["name"]
    rules = [r for p in policies for r in p["spec"].get("ingress", [])]
    assert rules == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                    }
                }
            ],
            "ports": [{"port": "http", "protocol": "TCP"}],
        }
    ]
    egress = [r for p in policies for r in p["spec"].get("egress", [])]
    ports = {port["port"] for rule in egress for port in rule["ports"]}
    assert {53, 4222, 6379, 26379, 443} <= ports  # DNS, NATS, Redis, sentinels, S3


def test_kube_prometheus_stack_selects_the_monitor_and_the_rules(docs: list[Doc]) -> None:
    for doc in kind(docs, "ServiceMonitor") + kind(docs, "PrometheusRule"):
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_a_changed_setting_rolls_the_pods(tmp_path: Path) -> None:
    """The settings ConfigMap is generated with a hash of its content in its name, which every
    pod template references: a changed value is a changed template, a rollout."""

    def referenced(folder: Path) -> set[str]:
        return {
            source["configMapRef"]["name"]
            for doc in workloads(render(folder))
            for source in pod_spec(doc)["containers"][0]["envFrom"]
        }

    shutil.copytree(K8S, tmp_path / "k8s")
    overlay = tmp_path / "k8s" / "overlays" / "example"
    before = referenced(overlay)
    assert len(before) == 1
    env = overlay / "config.env"
    env.write_text(env.read_text() + "CKPT_HA_LOG_LEVEL=DEBUG\n")
    after = referenced(overlay)
    assert len(after) == 1
    assert after != before
