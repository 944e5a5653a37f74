"""Checks an OpenTelemetry Collector config the way ``otelcol validate`` would, without a collector.

No collector binary can be installed on this project's machines (Debian ships none; PyPI and npm
carry no official build; the Go toolchain Debian ships is too old to build one), so this module
checks ``observability/otel-collector.yml`` against the collector's documented configuration:

* ``${env:NAME:-default}`` / ``${NAME}`` are expanded as the collector's env provider does;
* every component this project uses has a JSON Schema of the keys its documentation lists
  (written here from those docs, not copied), and unknown keys are errors, as they are for the
  collector ("has invalid keys");
* component ids are ``type[/name]`` of a known type, every id a pipeline or ``service.extensions``
  names is defined, a pipeline has receivers and exporters, and the documented rules the collector
  enforces at start (memory_limiter first, spike limit below the limit) hold.

Components outside the table are reported as unknown rather than waved through.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import jsonschema

DURATION = r"^(0|[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)$"
HOST_PORT = r"^(\[[0-9a-fA-F:.%]+\]|[A-Za-z0-9_.-]*):\d{1,5}$"
RESOURCE_ACTIONS = ("insert", "update", "upsert", "delete", "hash", "extract", "convert")
_ENV = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_DUR = {"type": "string", "pattern": DURATION}
_TLS_CLIENT = _obj(
    {
        "insecure": {"type": "boolean"},
        "insecure_skip_verify": {"type": "boolean"},
        "ca_file": {"type": "string"},
        "cert_file": {"type": "string"},
        "key_file": {"type": "string"},
        "server_name_override": {"type": "string"},
        "min_version": {"type": "string"},
        "max_version": {"type": "string"},
        "reload_interval": _DUR,
    }
)
_TLS_SERVER = _obj(
    {
        "ca_file": {"type": "string"},
        "cert_file": {"type": "string"},
        "key_file": {"type": "string"},
        "client_ca_file": {"type": "string"},
        "min_version": {"type": "string"},
        "max_version": {"type": "string"},
        "reload_interval": _DUR,
    }
)
_GRPC_SERVER = _obj(
    {
        "endpoint": {"type": "string", "pattern": HOST_PORT},
        "transport": {"type": "string"},
        "tls": _TLS_SERVER,
        "max_recv_msg_size_mib": {"type": "integer"},
        "max_concurrent_streams": {"type": "integer"},
        "read_buffer_size": {"type": "integer"},
        "write_buffer_size": {"type": "integer"},
        "include_metadata": {"type": "boolean"},
        "keepalive": {"type": "object"},
        "auth": {"type": "object"},
    }
)
_HTTP_SERVER = _obj(
    {
        "endpoint": {"type": "string", "pattern": HOST_PORT},
        "tls": _TLS_SERVER,
        "cors": {"type": "object"},
        "auth": {"type": "object"},
        "include_metadata": {"type": "boolean"},
        "max_request_body_size": {"type": "integer"},
        "compression_algorithms": {"type": "array", "items": {"type": "string"}},
        "read_timeout": _DUR,
        "read_header_timeout": _DUR,
        "write_timeout": _DUR,
        "idle_timeout": _DUR,
        "traces_url_path": {"type": "string"},
        "metrics_url_path": {"type": "string"},
        "logs_url_path": {"type": "string"},
    }
)
_EXPORTER_HELPER = {
    "timeout": _DUR,
    "sending_queue": {"type": "object"},
    "retry_on_failure": {"type": "object"},
}

SCHEMAS: Mapping[tuple[str, str], dict[str, Any]] = {
    ("receivers", "otlp"): _obj(
        {
            "protocols": {
                **_obj({"grpc": _GRPC_SERVER, "http": _HTTP_SERVER}),
                "minProperties": 1,  # "must specify at least one protocol"
            }
        },
        required=("protocols",),
    ),
    ("processors", "memory_limiter"): _obj(
        {
            "check_interval": _DUR,
            "limit_mib": {"type": "integer", "minimum": 1},
            "spike_limit_mib": {"type": "integer", "minimum": 0},
            "limit_percentage": {"type": "integer", "minimum": 1, "maximum": 100},
            "spike_limit_percentage": {"type": "integer", "minimum": 0, "maximum": 100},
        },
        required=("check_interval",),
    ),
    ("processors", "batch"): _obj(
        {
            "send_batch_size": {"type": "integer", "minimum": 0},
            "send_batch_max_size": {"type": "integer", "minimum": 0},
            "timeout": _DUR,
            "metadata_keys": {"type": "array", "items": {"type": "string"}},
            "metadata_cardinality_limit": {"type": "integer"},
        }
    ),
    ("processors", "resource"): _obj(
        {
            "attributes": {
                "type": "array",
                "minItems": 1,
                "items": _obj(
                    {
                        "key": {"type": "string", "minLength": 1},
                        "action": {"enum": list(RESOURCE_ACTIONS)},
                        "value": {},
                        "from_attribute": {"type": "string"},
                        "from_context": {"type": "string"},
                        "pattern": {"type": "string"},
                        "converted_type": {"enum": ["int", "double", "string"]},
                    },
                    required=("key", "action"),
                ),
            }
        },
        required=("attributes",),
    ),
    ("exporters", "otlp"): _obj(
        {
            "endpoint": {"type": "string", "minLength": 1},
            "compression": {"enum": ["gzip", "snappy", "zstd", "none", ""]},
            "tls": _TLS_CLIENT,
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "keepalive": {"type": "object"},
            "balancer_name": {"type": "string"},
            "authority": {"type": "string"},
            "auth": {"type": "object"},
            "wait_for_ready": {"type": "boolean"},
            **_EXPORTER_HELPER,
        },
        required=("endpoint",),
    ),
    ("exporters", "debug"): _obj(
        {
            "verbosity": {"enum": ["basic", "normal", "detailed"]},
            "sampling_initial": {"type": "integer"},
            "sampling_thereafter": {"type": "integer"},
        }
    ),
    ("extensions", "health_check"): _obj(
        {
            "endpoint": {"type": "string", "pattern": HOST_PORT},
            "path": {"type": "string"},
            "tls": _TLS_SERVER,
            "check_collector_pipeline": {"type": "object"},
            "response_body": {"type": "object"},
        }
    ),
}
"""(kind, component type) -> the JSON Schema of its config, from the collector's documentation."""

KINDS = ("receivers", "processors", "exporters", "extensions", "connectors")
SIGNALS = ("traces", "metrics", "logs")


def expand_env(value: Any, env: Mapping[str, str] | None = None) -> Any:
    """``${env:NAME:-default}`` and ``${NAME}`` replaced as the collector's env provider does
    (an unset variable without a default expands to the empty string)."""
    env = os.environ if env is None else env
    if isinstance(value, dict):
        return {k: expand_env(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, env) for v in value]
    if not isinstance(value, str):
        return value
    whole = _ENV.fullmatch(value)

    def repl(m: re.Match[str]) -> str:
        return env.get(m.group(1)) or (m.group(2) or "")

    expanded = _ENV.sub(repl, value)
    if whole is not None and expanded.lstrip("-").isdigit():
        return int(expanded)  # a whole-value reference is typed, as in the collector
    return expanded


def _type_of(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def problems(config: Mapping[str, Any], env: Mapping[str, str] | None = None) -> list[str]:
    """Every reason the collector would refuse ``config`` (empty: it is valid)."""
    config = expand_env(dict(config), env)
    found: list[str] = []
    unknown_top = set(config) - {*KINDS, "service"}
    if unknown_top:
        found.append(f"unknown top-level keys: {sorted(unknown_top)}")
    defined: dict[str, set[str]] = {}
    for kind in KINDS:
        section = config.get(kind) or {}
        defined[kind] = set(section)
        for component_id, body in section.items():
            if not re.fullmatch(r"[a-z0-9_]+(/[^/\s]+)?", component_id):
                found.append(f"{kind}.{component_id}: not a type[/name] id")
                continue
            schema = SCHEMAS.get((kind, _type_of(component_id)))
            if schema is None:
                found.append(f"{kind}.{component_id}: unknown component type")
                continue
            validator = jsonschema.Draft202012Validator(schema)
            for error in validator.iter_errors(body or {}):
                where = ".".join(str(p) for p in error.absolute_path)
                found.append(
                    f"{kind}.{component_id}{'.' + where if where else ''}: {error.message}"
                )
            found.extend(_rules(kind, component_id, body or {}))
    service = config.get("service") or {}
    unknown_service = set(service) - {"extensions", "pipelines", "telemetry"}
    if unknown_service:
        found.append(f"service: unknown keys {sorted(unknown_service)}")
    for ext in service.get("extensions") or []:
        if ext not in defined["extensions"]:
            found.append(f"service.extensions: {ext} is not defined")
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        found.append("service.pipelines: none")
    for pipeline_id, pipeline in pipelines.items():
        if _type_of(pipeline_id) not in SIGNALS:
            found.append(f"service.pipelines.{pipeline_id}: unknown signal")
        extra = set(pipeline) - {"receivers", "processors", "exporters"}
        if extra:
            found.append(f"service.pipelines.{pipeline_id}: unknown keys {sorted(extra)}")
        for part in ("receivers", "exporters"):
            if not pipeline.get(part):
                found.append(f"service.pipelines.{pipeline_id}: must have at least one {part[:-1]}")
        for part in ("receivers", "processors", "exporters"):
            ids = pipeline.get(part) or []
            if len(set(ids)) != len(ids):
                found.append(f"service.pipelines.{pipeline_id}.{part}: an id is repeated")
            for component_id in ids:
                if component_id not in defined[part] | defined["connectors"]:
                    found.append(
                        f"service.pipelines.{pipeline_id}.{part}: {component_id} is not defined"
                    )
        processors = pipeline.get("processors") or []
        limiters = [i for i, p in enumerate(processors) if _type_of(p) == "memory_limiter"]
        if limiters and limiters != [0]:
            found.append(
                f"service.pipelines.{pipeline_id}: memory_limiter must be the first processor"
            )
    return found


def _rules(kind: str, component_id: str, body: Mapping[str, Any]) -> list[str]:
    """Documented checks beyond the keys' types (the components' own Validate)."""
    where = f"{kind}.{component_id}"
    kind_type = (kind, _type_of(component_id))
    if kind_type == ("processors", "memory_limiter"):
        limit, spike = body.get("limit_mib"), body.get("spike_limit_mib")
        if limit is None and body.get("limit_percentage") is None:
            return [f"{where}: needs limit_mib or limit_percentage"]
        if isinstance(limit, int) and isinstance(spike, int) and spike >= limit:
            return [f"{where}: spike_limit_mib must be smaller than limit_mib"]
    if kind_type == ("processors", "batch"):
        size, most = body.get("send_batch_size"), body.get("send_batch_max_size")
        if isinstance(size, int) and isinstance(most, int) and 0 < most < size:
            return [f"{where}: send_batch_max_size must be >= send_batch_size"]
    if kind_type == ("processors", "resource"):
        wants_value = {"insert", "update", "upsert"}
        return [
            f"{where}.attributes.{a.get('key')}: {a.get('action')} needs a value or a source"
            for a in body.get("attributes") or []
            if a.get("action") in wants_value
            and "value" not in a
            and "from_attribute" not in a
            and "from_context" not in a
        ]
    return []
