"""The Kubernetes manifests of deploy/k8s/, rendered and validated offline.

`render` builds a kustomization the way ``kubectl kustomize`` does for the subset deploy/k8s/
uses (resources, components, configMapGenerator from env files with the content-hash name
suffix and the references to it rewritten, namespace, images, map-merging patches), so that no
cluster tool is needed; a test compares it with ``kubectl kustomize``. `problems` validates
each object: built-in kinds against the Kubernetes OpenAPI schemas shipped by
kubernetes-validate (strict: an unknown field is an error), the Prometheus-operator kinds
against their required fields.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30"
"""The oldest Kubernetes the manifests are checked against (all they use is older still)."""

Doc = dict[str, Any]
SUPPORTED = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "configMapGenerator",
    "namespace",
    "images",
    "patches",
}
CLUSTER_SCOPED = {"Namespace"}


class Unsupported(ValueError):
    """A kustomization field or patch this renderer does not reproduce."""


def load(path: Path) -> list[Doc]:
    """The objects of one YAML file (empty documents left out)."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def render(folder: Path) -> list[Doc]:
    """The objects ``kubectl kustomize folder`` would print, in resource order."""
    docs, generated = _render(folder)
    _suffix_generated(docs, generated)
    return docs


def _render(folder: Path) -> tuple[list[Doc], set[str]]:
    """The objects, and the names of the ConfigMaps generated (their hash suffix not yet set)."""
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    extra = set(kust) - SUPPORTED
    if extra:
        raise Unsupported(f"{folder}: kustomization fields not rendered here: {sorted(extra)}")
    docs: list[Doc] = []
    generated: set[str] = set()
    for entry in kust.get("resources", []):
        path = folder / entry
        if path.is_dir():
            more, names = _render(path)
            docs.extend(more)
            generated |= names
        else:
            docs.extend(load(path))
    for entry in kust.get("components", []):  # applied to what the resources gave
        more, names = _render_component(folder / entry, docs)
        docs.extend(more)
        generated |= names
    for generator in kust.get("configMapGenerator", []):
        generated.add(_generate(folder, generator, docs))
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
    return docs, generated


def _render_component(folder: Path, docs: list[Doc]) -> tuple[list[Doc], set[str]]:
    """A Component's own resources (returned) and its patches, applied to ``docs`` too."""
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    if kust.get("kind") != "Component":
        raise Unsupported(f"{folder}: not a Component")
    if set(kust) - {"apiVersion", "kind", "resources", "patches"}:
        raise Unsupported(f"{folder}: component fields not rendered here: {sorted(kust)}")
    own: list[Doc] = []
    for entry in kust.get("resources", []):
        own.extend(load(folder / entry))
    for patch in kust.get("patches", []):
        if set(patch) != {"path"}:
            raise Unsupported(f"{folder}: only patches by path are rendered here: {patch}")
        for change in load(folder / patch["path"]):
            _apply_patch([*docs, *own], change)
    return own, set()


def _env_file(path: Path) -> dict[str, str]:
    data = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise Unsupported(f"{path}: not KEY=VALUE: {line!r}")
        data[key] = value
    return data


def _generate(folder: Path, generator: Doc, docs: list[Doc]) -> str:
    """A configMapGenerator entry (env files only): a new ConfigMap, or merged into one."""
    if set(generator) - {"name", "envs", "behavior", "options"}:
        raise Unsupported(f"{folder}: configMapGenerator fields not rendered here: {generator}")
    data: dict[str, str] = {}
    for env in generator.get("envs", []):
        data.update(_env_file(folder / env))
    options = generator.get("options", {})
    if set(options) - {"labels"}:
        raise Unsupported(f"{folder}: generator options not rendered here: {options}")
    name = generator["name"]
    behavior = generator.get("behavior", "create")
    if behavior == "merge":
        (target,) = [d for d in docs if (d["kind"], d["metadata"]["name"]) == ("ConfigMap", name)]
        target["data"] = {**target.get("data", {}), **data}
        target["metadata"].setdefault("labels", {}).update(options.get("labels", {}))
        return str(name)
    if behavior != "create":
        raise Unsupported(f"{folder}: configMapGenerator behavior {behavior!r}")
    meta: Doc = {"name": name}
    if options.get("labels"):
        meta["labels"] = dict(options["labels"])
    docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    return str(name)


def config_map_hash(data: dict[str, str]) -> str:
    """kustomize's name suffix of a generated ConfigMap: the first ten hex digits of the sha256
    of its JSON encoding (Go's: sorted keys, no spaces, <, > and & escaped), with the letters
    and digits that could spell words or read as a number swapped. kustomize 5 looks the name up
    under a path it never finds (``metadata/name`` as one key), so the name hashed is empty."""
    text = json.dumps(
        {"data": data, "kind": "ConfigMap", "name": ""},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        text = text.replace(char, escaped)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans({"0": "g", "1": "h", "3": "k", "a": "m", "e": "t"}))


def _suffix_generated(docs: list[Doc], generated: set[str]) -> None:
    renamed = {}
    for doc in docs:
        name = doc["metadata"]["name"]
        if doc["kind"] == "ConfigMap" and name in generated:
            renamed[name] = f"{name}-{config_map_hash(doc.get('data', {}))}"
            doc["metadata"]["name"] = renamed[name]
    for doc in docs:
        spec = _pod(doc)
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef")
                if ref is not None and ref["name"] in renamed:
                    ref["name"] = renamed[ref["name"]]
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                if ref is not None and ref["name"] in renamed:
                    ref["name"] = renamed[ref["name"]]
        for volume in spec.get("volumes", []):
            ref = volume.get("configMap")
            if ref is not None and ref["name"] in renamed:
                ref["name"] = renamed[ref["name"]]


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


def _pod(doc: Doc) -> Doc:
    """The pod spec of a workload (a CronJob's through its job template); empty for others."""
    spec = doc.get("spec", {})
    if doc.get("kind") == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    pod: Doc = spec.get("template", {}).get("spec", {}) if "template" in spec else {}
    return pod


def _containers(doc: Doc) -> list[Doc]:
    pod = _pod(doc)
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
    spec = _pod(doc)
    if not spec:
        raise KeyError(f"{doc['kind']}/{doc['metadata']['name']} has no pod template")
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
