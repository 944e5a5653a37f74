"""The on-call toolbox Pod (deploy/toolbox/, docs/RUNBOOK.md#toolbox), checked offline like
deploy/k8s: a valid object, hardened as the services are, with the operator's own Secrets (not
the services' shared ones), the CA and the signing key mounted as files the settings read."""

from __future__ import annotations

from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.k8s import ROOT, all_problems, load

TOOLBOX = ROOT / "deploy" / "toolbox" / "toolbox.yaml"


def test_the_toolbox_is_a_valid_hardened_pod_with_the_operators_own_secrets() -> None:
    docs = load(TOOLBOX)
    assert all_problems(docs) == {}
    [pod] = docs
    assert pod["kind"] == "Pod"
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    [box] = spec["containers"]
    assert box["securityContext"]["readOnlyRootFilesystem"] is True
    assert box["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert set(box["resources"]["limits"]) == {"cpu", "memory"}
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    assert secrets["nats"] == "ckpt-ha-nats-operator"
    assert secrets["redis"] == "ckpt-ha-redis-operator"
    assert {"signing", "ca"} <= set(secrets)
    env = {e["name"]: e["value"] for e in box["env"]}
    assert (env["CKPT_HA_NATS_USER"], env["CKPT_HA_REDIS_USER"]) == ("operator", "operator")
    mounts = {m["name"]: m["mountPath"] for m in box["volumeMounts"]}
    for name, variable in (("nats", "CKPT_HA_NATS_PASSWORD_FILE"),
                           ("redis", "CKPT_HA_REDIS_PASSWORD_FILE"),
                           ("signing", "CKPT_HA_SIGNING_KEY_FILE")):  # fmt: skip
        assert env[variable].startswith(mounts[name] + "/"), variable
    fields = set(ServiceSettings.model_fields)
    named = {v.removeprefix("CKPT_HA_").removesuffix("_FILE").lower() for v in env}
    assert named - fields <= {"home", "actor", "aws_shared_credentials"}
