"""The Kubernetes manifests of deploy/k8s/, rendered and validated offline.

`render` builds a kustomization the way ``kubectl kustomize`` does for the subset
deploy/k8s/ uses (resources, namespace, images, ConfigMap patches), so that no cluster tool is
needed; a test compares it with ``kubectl kustomize`` where that is installed. `problems`
validates each object: built-in kinds against the Kubernetes OpenAPI schemas shipped by
kubernetes-validate (strict: an unknown field is an error), the Prometheus-operator kinds
against their required fields.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30"
"""The oldest Kubernetes the manifests are checked against (all they use is older still)."""

Doc = dict[str, Any]
SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
CLUSTER_SCOPED = {"Namespace"}


class Unsupported(ValueError):
    """A kustomization field or patch this renderer does not reproduce."""


def load(path: Path) -> list[Doc]:
    """The objects of one YAML file (empty documents left out)."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def render(folder: Path) -> list[Doc]:
    """The objects ``kubectl kustomize folder`` would print, in resource order."""
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    extra = set(kust) - SUPPORTED
    if extra:
        raise Unsupported(f"{folder}: kustomization fields not rendered here: {sorted(extra)}")
    docs: list[Doc] = []
    for entry in kust.get("resources", []):
        path = folder / entry
        docs.extend(render(path) if path.is_dir() else load(path))
    for patch in kust.get("patches", []):
        if set(patch) != {"path"}:
            raise Unsupported(f"{folder}: only patches by path are rendered here: {patch}")
        for change in load(folder / patch["path"]):
            _apply_patch(docs, change)
    for image in kust.get("images", []):
        for doc in docs:
            _set_image(doc, image)
    if "namespace" in kust:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc.setdefault("metadata", {})["namespace"] = kust["namespace"]
    return docs


def _apply_patch(docs: list[Doc], change: Doc) -> None:
    key = (change["kind"], change["metadata"]["name"])
    targets = [d for d in docs if (d["kind"], d["metadata"]["name"]) == key]
    if len(targets) != 1:
        raise Unsupported(f"patch target {key}: {len(targets)} objects match")
    _merge(targets[0], change)


def _merge(into: Doc, change: Doc) -> None:
    """A strategic-merge patch without lists: maps merge key by key, scalars replace."""
    for key, value in change.items():
        if isinstance(value, list):
            raise Unsupported(f"a patch that merges a list ({key}) is not rendered here")
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _containers(doc: Doc) -> list[Doc]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", {}) if "template" in spec else {}
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def _set_image(doc: Doc, image: Doc) -> None:
    for container in _containers(doc):
        name, _, tag = container["image"].partition(":")
        if name == image["name"]:
            new = image.get("newName", name)
            container["image"] = (
                f"{new}:{image.get('newTag', tag)}" if tag or "newTag" in image else new
            )


def _required(doc: Doc, *path: str) -> list[str]:
    node: Any = doc
    for part in path:
        if not isinstance(node, dict) or part not in node or node[part] in (None, "", [], {}):
            return [f"missing {'.'.join(path)}"]
        node = node[part]
    return []


def _service_monitor(doc: Doc) -> list[str]:
    found = _required(doc, "metadata", "name") + _required(doc, "spec", "selector")
    endpoints = doc.get("spec", {}).get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        return [*found, "missing spec.endpoints"]
    for i, endpoint in enumerate(endpoints):
        if not isinstance(endpoint, dict) or not ({"port", "targetPort"} & set(endpoint)):
            found.append(f"spec.endpoints[{i}]: needs port or targetPort")
    return found


def _prometheus_rule(doc: Doc) -> list[str]:
    found = _required(doc, "metadata", "name")
    groups = doc.get("spec", {}).get("groups")
    if not isinstance(groups, list) or not groups:
        return [*found, "missing spec.groups"]
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or not group.get("name"):
            found.append(f"spec.groups[{i}]: missing name")
            continue
        rules = group.get("rules")
        if not isinstance(rules, list) or not rules:
            found.append(f"spec.groups[{i}]: missing rules")
            continue
        for j, rule in enumerate(rules):
            kinds = {"alert", "record"} & set(rule)
            if len(kinds) != 1 or not rule.get("expr"):
                found.append(f"spec.groups[{i}].rules[{j}]: needs expr and one of alert, record")
    return found


CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _service_monitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): _prometheus_rule,
}


def problems(doc: Doc) -> list[str]:
    """What is wrong with one object; empty when it is valid."""
    crd = CRDS.get((doc.get("apiVersion", ""), doc.get("kind", "")))
    if crd is not None:
        return crd(doc)
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [f"no schema for {doc.get('apiVersion')} {doc.get('kind')}"]
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        return [f"{where}: {exc.message}"]
    return []


def all_problems(docs: list[Doc]) -> dict[str, list[str]]:
    """`problems` of each object that has any, by ``Kind/name``."""
    found = {}
    for doc in docs:
        wrong = problems(doc)
        if wrong:
            found[f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"] = wrong
    return found


class MissingSecret(KeyError):
    """A pod mounts a Secret that was not created (and is not optional): Kubernetes would not
    start it."""


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def lay_out_pod(
    doc: Doc, configmaps: dict[str, dict[str, str]], secrets: dict[str, dict[str, str]], root: Path
) -> dict[str, str]:
    """The environment the object's first container would get, with its volumes laid out under
    ``root`` as the kubelet would mount them (a Secret's items as files, an emptyDir as an empty
    folder); each variable naming a path under a mount is pointed at the local folder."""
    spec = pod_spec(doc)
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        local = root / mount["mountPath"].lstrip("/")
        local.mkdir(parents=True, exist_ok=True)
        mounts[mount["mountPath"]] = local
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        data = secrets.get(secret["secretName"])
        if data is None:
            if secret.get("optional"):
                continue
            raise MissingSecret(secret["secretName"])
        for item in secret.get("items") or [{"key": k, "path": k} for k in data]:
            (local / item["path"]).write_text(data[item["key"]])
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]])
    env.update({e["name"]: e["value"] for e in container.get("env", [])})
    for name, value in env.items():
        for path, local in mounts.items():
            if value == path or value.startswith(path + "/"):
                env[name] = str(local) + value[len(path) :]
    return env
