"""The scrape configuration the Prometheus Operator generates from a ServiceMonitor, for a real
Prometheus outside Kubernetes.

`scrape_config` renders one endpoint of a ServiceMonitor as the Operator does (its
``generateServiceMonitorConfig``: the selector and port kept, then ``namespace``, ``service``,
``pod``, ``container``, ``job`` and ``endpoint`` set from the discovered objects, then the
endpoint's own ``relabelings``, ``honor_labels`` from ``honorLabels``), with one difference:
the targets come from a file (`targets`) instead of Kubernetes service discovery. That file
gives every target the ``__meta_kubernetes_*`` labels the endpoints role would (namespace,
Service name and labels, endpoint port name, pod name, labels, container and phase), taken
from the shipped Service and Deployment objects, so the relabelling runs on what a cluster
would give it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Doc = dict[str, Any]


def _sanitize(name: str) -> str:
    """A Kubernetes label name as Prometheus's discovery spells it in a meta label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _relabel(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A ServiceMonitor ``relabelings`` entry in Prometheus's spelling."""
    names = {
        "sourceLabels": "source_labels",
        "targetLabel": "target_label",
        "separator": "separator",
        "regex": "regex",
        "replacement": "replacement",
        "action": "action",
        "modulus": "modulus",
    }
    return {names[k]: v for k, v in rule.items()}


def scrape_config(
    monitor: Doc, index: int, namespace: str, sd_file: Path, *, interval: str | None = None
) -> dict[str, Any]:
    """Endpoint ``index`` of ``monitor`` as the Operator renders it (targets from
    ``sd_file``); ``interval`` overrides the endpoint's scrape interval (a test scrapes every
    second)."""
    spec = monitor["spec"]
    endpoint = spec["endpoints"][index]
    port = endpoint["port"]
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}
    ]
    for key, value in sorted(spec["selector"].get("matchLabels", {}).items()):
        name = _sanitize(key)
        relabel.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{name}",
                    f"__meta_kubernetes_service_labelpresent_{name}",
                ],
                "regex": f"({value});true",
            }
        )
    relabel += [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_endpoint_port_name"],
            "regex": port,
        },
        {
            "source_labels": [
                "__meta_kubernetes_endpoint_address_target_kind",
                "__meta_kubernetes_endpoint_address_target_name",
            ],
            "separator": ";",
            "regex": "Node;(.*)",
            "replacement": "${1}",
            "target_label": "node",
        },
        {
            "source_labels": [
                "__meta_kubernetes_endpoint_address_target_kind",
                "__meta_kubernetes_endpoint_address_target_name",
            ],
            "separator": ";",
            "regex": "Pod;(.*)",
            "replacement": "${1}",
            "target_label": "pod",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {
            "action": "drop",
            "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "(Failed|Succeeded)",
        },
    ]
    for label in spec.get("targetLabels", []):
        relabel.append(
            {
                "source_labels": [f"__meta_kubernetes_service_label_{_sanitize(label)}"],
                "target_label": _sanitize(label),
                "regex": "(.+)",
                "replacement": "${1}",
            }
        )
    for label in spec.get("podTargetLabels", []):
        relabel.append(
            {
                "source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(label)}"],
                "target_label": _sanitize(label),
                "regex": "(.+)",
                "replacement": "${1}",
            }
        )
    relabel.append(
        {
            "source_labels": ["__meta_kubernetes_service_name"],
            "target_label": "job",
            "replacement": "${1}",
        }
    )
    if "jobLabel" in spec:
        relabel.append(
            {
                "source_labels": [f"__meta_kubernetes_service_label_{_sanitize(spec['jobLabel'])}"],
                "target_label": "job",
                "regex": "(.+)",
                "replacement": "${1}",
            }
        )
    relabel.append({"target_label": "endpoint", "replacement": port})
    relabel += [_relabel(r) for r in endpoint.get("relabelings", [])]
    relabel += [
        {
            "source_labels": ["__address__"],
            "target_label": "__tmp_hash",
            "modulus": 1,
            "action": "hashmod",
        },
        {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"},
    ]
    return {
        "job_name": f"serviceMonitor/{namespace}/{monitor['metadata']['name']}/{index}",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "honor_timestamps": True,
        "scrape_interval": interval or endpoint.get("interval", "30s"),
        "metrics_path": endpoint.get("path", "/metrics"),
        "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "1s"}],
        "relabel_configs": relabel,
        "metric_relabel_configs": [_relabel(r) for r in endpoint.get("metricRelabelings", [])],
    }


@dataclass(frozen=True)
class Pod:
    """A running replica standing in for a pod of ``deployment``."""

    name: str
    deployment: str
    address: str
    """host:port of its metrics endpoint."""


def targets(objects: Sequence[Doc], namespace: str, pods: Sequence[Pod]) -> list[dict[str, Any]]:
    """The endpoints role's targets for ``pods``: one per pod, behind each Service whose
    selector matches the pod's template labels, each port of the Service its own target."""
    deployments = {d["metadata"]["name"]: d for d in objects if d["kind"] == "Deployment"}
    services = [s for s in objects if s["kind"] == "Service"]
    groups: list[dict[str, Any]] = []
    for pod in pods:
        template = deployments[pod.deployment]["spec"]["template"]
        pod_labels: dict[str, str] = template["metadata"]["labels"]
        container = template["spec"]["containers"][0]["name"]
        for service in services:
            selector: dict[str, str] = service["spec"].get("selector", {})
            if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
                continue
            service_labels: dict[str, str] = service["metadata"].get("labels", {})
            for port in service["spec"]["ports"]:
                labels = {
                    "__meta_kubernetes_namespace": namespace,
                    "__meta_kubernetes_service_name": service["metadata"]["name"],
                    "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                    "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
                    "__meta_kubernetes_endpoint_ready": "true",
                    "__meta_kubernetes_endpoint_address_target_kind": "Pod",
                    "__meta_kubernetes_endpoint_address_target_name": pod.name,
                    "__meta_kubernetes_pod_name": pod.name,
                    "__meta_kubernetes_pod_container_name": container,
                    "__meta_kubernetes_pod_phase": "Running",
                    "__meta_kubernetes_pod_ready": "true",
                }
                for key, value in service_labels.items():
                    labels[f"__meta_kubernetes_service_label_{_sanitize(key)}"] = value
                    labels[f"__meta_kubernetes_service_labelpresent_{_sanitize(key)}"] = "true"
                for key, value in pod_labels.items():
                    labels[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = value
                    labels[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
                groups.append({"targets": [pod.address], "labels": labels})
    return groups


def selects(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether a ``kubectl -l`` equality selector (``a=b,c=d``) selects an object with
    ``labels``."""
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True
