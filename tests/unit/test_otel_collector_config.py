"""The shipped OpenTelemetry Collector config (observability/otel-collector.yml) is one the
collector accepts, and it listens where the docs tell the services to export.

No collector binary is installable here (see tests/support/otelcol_config.py), so the config is
checked against the collector's documented configuration; the mutated copies below prove the
check refuses what the collector would refuse.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.otelcol_config import expand_env, problems

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "observability" / "otel-collector.yml"


@pytest.fixture
def config() -> dict[str, Any]:
    loaded = yaml.safe_load(CONFIG.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_shipped_collector_config_is_valid(config: dict[str, Any]) -> None:
    assert problems(config, env={}) == []
    assert problems(config, env={"TRACES_OTLP_ENDPOINT": "tempo:4317"}) == []


def test_it_receives_otlp_grpc_on_4317_and_http_on_4318_in_the_traces_pipeline(
    config: dict[str, Any],
) -> None:
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")
    assert "otlp" in config["service"]["pipelines"]["traces"]["receivers"]


def test_environment_references_expand_as_the_collector_does() -> None:
    assert expand_env("${env:A:-x}", {}) == "x"
    assert expand_env("${env:A:-x}", {"A": "y"}) == "y"
    assert expand_env("${A}:1", {"A": "h"}) == "h:1"
    assert expand_env({"n": ["${env:N:-5}"]}, {}) == {"n": [5]}


def _mutate(config: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(config)
    *parents, last = path.split(".")
    node = changed
    for key in parents:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        ("receivers.otlp.protocols.grpc.endpont", "127.0.0.1:4317", "endpont"),
        ("receivers.otlp.protocols.grpc.endpoint", "4317", "does not match"),
        ("receivers.otlp.protocols", {}, "should be non-empty"),
        ("processors.batch.timeout", "5 seconds", "does not match"),
        ("processors.memory_limiter.spike_limit_mib", 600, "spike_limit_mib"),
        ("processors.resource.attributes", [{"key": "a", "action": "upsert"}], "needs a value"),
        ("processors.resource.attributes", [{"key": "a", "action": "set"}], "is not one of"),
        ("exporters.otlp/traces.endpoint", KeyError, "'endpoint' is a required property"),
        ("exporters.debug.verbosity", "loud", "is not one of"),
        ("exporters.jaeger", {"endpoint": "x:14250"}, "unknown component type"),
        ("service.pipelines.traces.exporters", ["otlp/tempo"], "otlp/tempo is not defined"),
        ("service.pipelines.traces.processors", ["batch", "memory_limiter"], "must be the first"),
        ("service.pipelines.traces.receivers", [], "at least one receiver"),
        ("service.extensions", ["zpages"], "zpages is not defined"),
        ("service.pipelines.spans", {"receivers": ["otlp"], "exporters": ["debug"]}, "signal"),
    ],
)
def test_the_check_refuses_what_the_collector_refuses(
    config: dict[str, Any], path: str, value: Any, complaint: str
) -> None:
    found = problems(_mutate(config, path, value), env={})
    assert any(complaint in p for p in found), found
