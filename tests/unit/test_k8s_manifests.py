"""deploy/k8s/ and the Dockerfile, checked offline: the generated manifests match their sources,
the base and the example overlay render, every object is valid (Kubernetes schemas for built-in
kinds, required fields for ServiceMonitor and PrometheusRule), each service is probed, sized and
given its secrets as files, and every command the image runs is a real `ckpt-ha` command.
No container engine or cluster is needed; `kubectl kustomize` is compared where installed."""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpt_ha import credentials
from ckpt_ha.cli import settings_table
from ckpt_ha.cli.parser import build_parser
from ckpt_ha.ops import k8s
from ckpt_ha.runtime.catalog import SERVICE_NAMES
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.k8s import (
    K8S,
    ROOT,
    Doc,
    Unsupported,
    all_problems,
    load,
    pod_spec,
    problems,
    render,
)

BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "example"
DOCKERFILE = ROOT / "Dockerfile"


def kind(docs: list[Doc], name: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == name]


def pod(doc: Doc) -> Doc:
    return pod_spec(doc)


def config_of(docs: list[Doc]) -> Doc:
    """The generated settings ConfigMap (its name carries kustomize's content hash)."""
    (config,) = [
        d
        for d in kind(docs, "ConfigMap")
        if re.fullmatch(r"ckpt-ha-config-[0-9a-z]{10}", d["metadata"]["name"])
    ]
    return config


@pytest.fixture(scope="module")
def overlay() -> list[Doc]:
    return render(OVERLAY)


def test_generated_manifests_match_their_sources() -> None:
    assert k8s.main(["--check"]) == 0, "run: python -m ckpt_ha.ops.k8s"


def test_a_changed_service_shows_as_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(k8s.RESOURCES, "registrar", ("1", "1Gi", "2", "2Gi"))
    assert k8s.main(["--check"]) == 1


def test_the_rule_and_dashboards_are_the_shipped_ones() -> None:
    (rule,) = load(BASE / "prometheusrule.yaml")
    assert rule["spec"] == yaml.safe_load((ROOT / "observability" / "alerts.yml").read_text())
    shipped = {
        p.name: p.read_text() for p in (ROOT / "observability/grafana/dashboards").glob("*.json")
    }
    maps = load(BASE / "dashboards.yaml")
    assert {name: text for m in maps for name, text in m["data"].items()} == shipped
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)


@pytest.mark.parametrize("folder", [BASE, OVERLAY], ids=["base", "overlay"])
def test_every_object_is_valid(folder: Path) -> None:
    docs = render(folder)
    assert all_problems(docs) == {}
    deployments = {d["metadata"]["name"] for d in kind(docs, "Deployment")}
    assert deployments == {f"ckpt-ha-{name}" for name in SERVICE_NAMES}
    assert {d["metadata"]["name"] for d in kind(docs, "Service")} == deployments
    assert [pod(d)["containers"][0]["args"] for d in kind(docs, "CronJob")] == [
        ["streams", "provision"]
    ]
    assert len(kind(docs, "ServiceMonitor")) == len(kind(docs, "PrometheusRule")) == 1


def test_every_manifest_file_is_rendered() -> None:
    """A file no kustomization lists would never be validated (nor applied)."""
    listed = set()
    folders = [
        BASE,
        OVERLAY,
        *(p.parent for p in (K8S / "components").glob("*/kustomization.yaml")),
    ]
    for folder in folders:
        kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
        listed |= {(folder / r).resolve() for r in kust.get("resources", [])}
        listed |= {(folder / p["path"]).resolve() for p in kust.get("patches", [])}
        for generator in kust.get("configMapGenerator", []):
            listed |= {(folder / e).resolve() for e in generator.get("envs", [])}
    files = {
        p.resolve()
        for p in K8S.rglob("*")
        if p.suffix in {".yaml", ".env"} and p.name != "kustomization.yaml"
    }
    assert files - listed == set()


def _deployment(docs: list[Doc]) -> Doc:
    return copy.deepcopy(kind(docs, "Deployment")[0])


def _container(doc: Doc) -> Doc:
    container: Doc = pod(doc)["containers"][0]
    return container


def _unknown_field(docs: list[Doc]) -> Doc:
    doc = _deployment(docs)
    _container(doc)["livenesProbe"] = {"httpGet": {"path": "/livez", "port": "http"}}
    return doc


def _port_as_text(docs: list[Doc]) -> Doc:
    doc = _deployment(docs)
    _container(doc)["ports"][0]["containerPort"] = "8080"
    return doc


def _no_containers(docs: list[Doc]) -> Doc:
    doc = _deployment(docs)
    del pod(doc)["containers"]
    return doc


def _monitor_without_endpoints(docs: list[Doc]) -> Doc:
    doc = copy.deepcopy(kind(docs, "ServiceMonitor")[0])
    del doc["spec"]["endpoints"]
    return doc


def _rule_without_expr(docs: list[Doc]) -> Doc:
    doc = copy.deepcopy(kind(docs, "PrometheusRule")[0])
    del doc["spec"]["groups"][0]["rules"][-1]["expr"]
    return doc


def _unknown_kind(docs: list[Doc]) -> Doc:
    return {"apiVersion": "apps/v1", "kind": "Deploymnet", "metadata": {"name": "x"}}


@pytest.mark.parametrize(
    "breaks",
    [
        _unknown_field,
        _port_as_text,
        _no_containers,
        _monitor_without_endpoints,
        _rule_without_expr,
        _unknown_kind,
    ],
)
def test_an_invalid_object_is_reported(overlay: list[Doc], breaks: Any) -> None:
    assert problems(breaks(overlay)) != []


def test_a_broken_file_fails_the_render_check(tmp_path: Path) -> None:
    base = tmp_path / "base"
    shutil.copytree(BASE, base)
    path = base / "servicemonitor.yaml"
    path.write_text(path.read_text().replace("  endpoints:", "  endpoint:"))
    assert all_problems(render(base)) == {"ServiceMonitor/ckpt-ha": ["missing spec.endpoints"]}


def test_a_list_patch_is_refused_not_rendered_wrong(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{BASE}]\npatches:\n  - path: patch.yaml\n"
    )
    (tmp_path / "patch.yaml").write_text(
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\n"
        "metadata: {name: ckpt-ha}\nspec: {endpoints: [{port: metrics}]}\n"
    )
    with pytest.raises(Unsupported, match="endpoints"):
        render(tmp_path)


def _known_variables() -> list[str]:
    return [n for v in settings_table.variables() for n in re.findall(r"`([A-Z0-9_*]+)`", v.name)]


def _is_known(name: str, known: list[str]) -> bool:
    return any(name == k or (k.endswith("*") and name.startswith(k[:-1])) for k in known)


def test_the_config_sets_only_documented_settings(overlay: list[Doc]) -> None:
    known = _known_variables()
    config = config_of(overlay)
    assert [n for n in config["data"] if not _is_known(n, known)] == []
    assert config["data"]["CKPT_HA_HTTP_HOST"] == "0.0.0.0"
    assert config["data"]["CKPT_HA_LOG_FORMAT"] == "json"
    for doc in kind(overlay, "Deployment") + kind(overlay, "CronJob"):
        env = [e["name"] for e in _container(doc)["env"]]
        assert [
            n for n in env if not _is_known(n, known) and n != "AWS_SHARED_CREDENTIALS_FILE"
        ] == []


def _secret_settings() -> set[str]:
    """The ``CKPT_HA_<FIELD>`` names that may be given as ``..._FILE``."""
    known = _known_variables()
    return {n.removesuffix("_FILE") for n in known if n.endswith("_FILE") and n.startswith("CKPT")}


def _mounted_secrets(doc: Doc) -> dict[str, str]:
    """Mount path -> Secret name, for the container's Secret volumes."""
    volumes = {v["name"]: v["secret"]["secretName"] for v in pod(doc)["volumes"] if "secret" in v}
    mounts = _container(doc)["volumeMounts"]
    return {m["mountPath"]: volumes[m["name"]] for m in mounts if m["name"] in volumes}


def test_each_service_is_probed_sized_and_reads_its_secrets_from_files(
    overlay: list[Doc],
) -> None:
    secrets = _secret_settings()
    nats_users = re.findall(r'user: "([^"]+)"', (ROOT / "deploy/nats/permissions.conf").read_text())
    redis_users = re.findall(r"^user (\S+) on", (ROOT / "deploy/redis/users.acl").read_text(), re.M)
    port = int(ServiceSettings.model_fields["http_port"].default or 0)
    assert port == 0  # the default picks a free port: the ConfigMap must fix one
    config = config_of(overlay)
    for doc in kind(overlay, "Deployment"):
        name = doc["metadata"]["name"].removeprefix("ckpt-ha-")
        c = _container(doc)
        assert c["ports"][0]["containerPort"] == int(config["data"]["CKPT_HA_HTTP_PORT"])
        assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert set(c["resources"]) == {"requests", "limits"}
        assert {"cpu", "memory"} <= set(c["resources"]["requests"])
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert all("valueFrom" not in e for e in c["env"])
        assert env["CKPT_HA_NATS_USER"] == name
        assert name in nats_users
        assert env["CKPT_HA_REDIS_USER"] == name
        assert name in redis_users
        # a secret only ever as a file the code reads through *_FILE, from a mounted Secret
        assert secrets & set(env) == set()
        files = {n: v for n, v in env.items() if n.endswith("_FILE")}
        assert {
            "CKPT_HA_NATS_PASSWORD_FILE",
            "CKPT_HA_REDIS_PASSWORD_FILE",
            "CKPT_HA_SIGNING_KEY_FILE",
        } <= set(files)
        mounted = _mounted_secrets(doc)
        for var, path in files.items():
            assert var.removesuffix("_FILE") in secrets or var == "AWS_SHARED_CREDENTIALS_FILE"
            assert str(Path(path).parent) in mounted, f"{name}: {var}={path} is not mounted"
        context = c["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert pod(doc)["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("folder", [BASE, OVERLAY], ids=["base", "overlay"])
def test_nats_and_redis_are_reached_over_tls_with_the_mounted_ca(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """deploy/nats and deploy/redis serve TLS only: every pod connects with tls:// and
    rediss:// URLs and verifies the servers against the CA mounted from its Secret."""
    docs = render(folder)
    config = config_of(docs)
    data = config["data"]
    assert {credentials.scheme(u) for u in credentials.nats_servers(data["NATS_URL"])} == {"tls"}
    assert credentials.scheme(data["REDIS_URL"]) in {"rediss", "rediss+sentinel"}
    assert data["CKPT_HA_NATS_CA_FILE"] == data["CKPT_HA_REDIS_CA_FILE"] == k8s.CA_FILE
    ca_dir = str(Path(k8s.CA_FILE).parent)
    for doc in kind(docs, "Deployment") + kind(docs, "CronJob"):
        assert _mounted_secrets(doc).get(ca_dir) == k8s.SECRET_NAMES["ca"], doc["metadata"]
        (volume,) = [
            v for v in pod(doc)["volumes"]
            if v.get("secret", {}).get("secretName") == k8s.SECRET_NAMES["ca"]
        ]  # fmt: skip
        assert volume["secret"]["items"] == [{"key": "ca.crt", "path": Path(k8s.CA_FILE).name}]
    # The services read them as they are: a CA file with a TLS URL, each client using it.
    for name, value in data.items():
        monkeypatch.setenv(name, value)
    settings = ServiceSettings()
    bus, redis = settings.bus(), settings.redis()
    assert (bus.ca_file, redis.ca_file) == (k8s.CA_FILE, k8s.CA_FILE)


def test_the_provision_job_runs_as_the_operator(overlay: list[Doc]) -> None:
    (job,) = kind(overlay, "CronJob")
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    env = {e["name"]: e["value"] for e in _container(job)["env"]}
    assert env["CKPT_HA_NATS_USER"] == "operator"
    (volume,) = [
        v
        for v in pod(job)["volumes"]
        if v.get("secret", {}).get("secretName") == "ckpt-ha-nats-operator"
    ]
    assert volume["secret"]["items"] == [{"key": "password", "path": "password"}]
    assert str(Path(env["CKPT_HA_NATS_PASSWORD_FILE"]).parent) in _mounted_secrets(job)


def test_every_container_command_is_a_real_cli_command(overlay: list[Doc]) -> None:
    served = []
    for doc in kind(overlay, "Deployment") + kind(overlay, "CronJob"):
        args = build_parser().parse_args(_container(doc)["args"])
        if args.command == "serve":
            served.append(args.name)
            assert doc["metadata"]["name"] == f"ckpt-ha-{args.name}"
        else:
            assert (args.command, args.action) == ("streams", "provision")
    assert sorted(served) == sorted(SERVICE_NAMES)


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (op.upper(), rest.strip())
        for op, _, rest in (line.partition(" ") for line in lines if line and line[0] != "#")
    ]


def test_the_dockerfile_copies_what_exists_and_runs_the_cli() -> None:
    """The image installs only the wheels scripts/build-image stages under build/image/wheels/
    (the locked dependencies by hash, the SBOM tool, the ckpt-ha wheel): the build itself
    downloads nothing. tests/system/e2e/test_image.py builds and runs it."""
    steps = _instructions()
    copies = [shlex.split(rest) for op, rest in steps if op == "COPY" and "--from" not in rest]
    sources = [src for parts in copies for src in parts[:-1]]
    assert sources == [f"build/image/wheels/{part}" for part in ("deps", "app", "sbom")]
    staging = (ROOT / "scripts" / "build-image").read_text()
    assert "stage=build/image/wheels" in staging
    for part in ("app", "deps", "sbom"):
        assert f'"$stage/{part}"' in staging, part
    for lock in ("requirements.lock", "sbom-tool.lock"):
        assert (ROOT / "deploy" / "image" / lock).is_file(), lock
        assert f"deploy/image/{lock}" in staging, lock
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "!build/image/wheels" in ignored
    entry = [rest for op, rest in steps if op == "ENTRYPOINT"]
    assert entry == ['["ckpt-ha"]']
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "ckpt-ha" in scripts
    installs = [rest for op, rest in steps if op == "RUN" and "pip" in rest]
    assert any("--require-hashes" in r and "requirements.lock" in r for r in installs)
    assert any('"ckpt-ha[server]"' in r for r in installs)  # the app, with the locked deps
    # The base is pinned by digest; a build argument selects another.
    (base,) = [rest for op, rest in steps if op == "ARG" and rest.startswith("BASE=")]
    assert re.fullmatch(r"BASE=[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", base), base


def test_the_image_runs_as_the_manifests_user_and_holds_no_secret(overlay: list[Doc]) -> None:
    steps = _instructions()
    (user,) = [rest for op, rest in steps if op == "USER"]
    uid = user.split(":")[0]
    assert uid not in {"0", "root"}
    for doc in kind(overlay, "Deployment") + kind(overlay, "CronJob"):
        assert pod(doc)["securityContext"]["runAsUser"] == int(uid)
    env = " ".join(rest for op, rest in steps if op in {"ENV", "ARG"})
    assert re.search(r"PASSWORD|SECRET|SIGNING_KEY|TOKEN|AWS_", env) is None, env
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)
