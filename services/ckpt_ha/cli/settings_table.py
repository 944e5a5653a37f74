"""The one table of environment variables (docs/CONFIGURATION.md), from the code that reads them.

``python -m ckpt_ha.cli.settings_table [--check]`` (or ``python -m ckpt_ha.cli.doc_tables``,
which renders every table of ``docs/`` that mirrors code) rewrites the block between the
``settings-table`` markers of docs/CONFIGURATION.md. Rows come from the settings classes
(`ServiceSettings`, each service's subclass as `ckpt_ha.cli.serve` lists them, `RunnerSettings`:
name, default, and the field's docstring as its meaning), then from `OTHER_VARIABLES`: what is
read before settings exist (logging, the CLI's home), by the training process (the runner's
protocol, `ckpt_ha.sdk.protocol`), or by a library from its standard variables. A test fails
when the docs and this output differ, and when a ``CKPT_HA_*`` name in the sources is in
neither.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from ckpt_ha.cli import doc_tables
from ckpt_ha.cli.serve import entries
from ckpt_ha.runner.settings import RunnerSettings
from ckpt_ha.runtime.settings import ServiceSettings, is_secret
from ckpt_ha.sdk import protocol
from ckpt_ha.sdk.resuming import RESTORE_STORAGE_WAIT_S
from ckpt_ha.telemetry import logs

NAME = "settings-table"
EVERY = "every service, `ckpt-ha run`, CLI commands"
JOB = "training process (set by `ckpt-ha run`)"


@dataclass
class Variable:
    name: str
    default: str
    read_by: str
    meaning: str


OTHER_VARIABLES = (
    Variable(logs.LOG_FORMAT_ENV, "`text`", "every process",
             "`json`: one JSON object per log line, with the `trace_id` and `span_id` of the "
             "current OpenTelemetry span when there is one (for a log collector)."),
    Variable(logs.LOG_LEVEL_ENV, "`INFO` (`serve`), `WARNING`", "every process",
             "Log level: `DEBUG`, `INFO`, `WARNING`, `ERROR`."),
    Variable("CKPT_HA_HOME", "`~/.ckpt-ha`", "the CLI, `ckpt-ha run`",
             "Local stack state, secrets it generated, run records (`runs/<job>/<run>/`)."),
    Variable("CKPT_HA_ACTOR", "login name", "the CLI",
             "Who the CLI records as acting (`quarantine`, `release`, `owner transfer`, `pin`, "
             "`unpin`, `tier set`, `reconcile --delete`)."),
    Variable("CKPT_HA_CONTEXT", "the file's `current`", "the CLI",
             "The named context every command talks to (`--context NAME` sets it for one "
             "command; docs/CLI.md#contexts)."),
    Variable("CKPT_HA_CONTEXTS", "`$CKPT_HA_HOME/contexts.toml`", "the CLI",
             "The file of named contexts."),
    Variable("CKPT_HA_IMAGE", "none", "`ckpt-ha run`",
             "The container image the job runs in, recorded in its runtime environment."),
    Variable(protocol.CODE_VERSION, "none", f"`ckpt-ha run`; {JOB}",
             "The code version the job declares (`--code-version` wins)."),
    Variable("CKPT_HA_SLURM_POLL_DIR",
             "`$XDG_RUNTIME_DIR` (else `/tmp`)`/ckpt-ha-squeue-<uid>-<cluster hash>`",
             "`ckpt-ha run --scheduler slurm`",
             "The directory through which the runners of one host share one `squeue` per "
             "interval (docs/SCHEDULERS.md); `off`: each runner polls alone."),
    Variable("CKPT_HA_PROMETHEUS", "`prometheus` on the PATH", "`ckpt-ha up`",
             "A Prometheus binary to evaluate the shipped alerts against the local stack."),
    Variable("CKPT_HA_NATS_PASSWORD_<USER>", "none", "nats-server (`deploy/nats/`)",
             "Each NATS user's password, read by the server config."),
    Variable("CKPT_HA_REDIS_PASSWORD_<USER>", "none",
             "`python -m ckpt_ha.registry.acl render --passwords-from-env`",
             "Each Redis ACL user's password, hashed into the rendered `users.acl`."),
    Variable(protocol.JOB, "none", JOB, "The job id; its presence means the process runs "
             "under the runner (`sdk.context()`)."),
    Variable(protocol.RUN_ID, "the job id", JOB, "The run."),
    Variable(protocol.ATTEMPT, "`1`", JOB, "The attempt number."),
    Variable(protocol.STORAGE_ROOT, "", JOB, ""),
    Variable(protocol.PROGRESS_FILE, "none", JOB,
             "File the SDK writes the last step to (the runner reports it in `job.failed`)."),
    Variable(protocol.NATS_URL, "", JOB, ""),
    Variable(protocol.SUBJECT_PREFIX, "", JOB, ""),
    Variable(protocol.EVENTS_STREAM, "", JOB, ""),
    Variable(protocol.NATS_USER, "", JOB, "A training process gets the `job` login."),
    Variable(protocol.NATS_PASSWORD, "", JOB, ""),
    Variable(protocol.NATS_CA_FILE, "", JOB, ""),
    Variable(protocol.JOB_KEY, "none", JOB,
             "The job's signing key (hex), derived from the master key: its events are signed."),
    Variable(protocol.ENVIRONMENT, "none", JOB,
             "JSON of the runtime environment `job.started` reported."),
    Variable(protocol.TOPOLOGY, "none", JOB, "JSON of the topology `job.started` reported."),
    Variable(protocol.RESUME_PLAN, "none", JOB, "A relaunch's resume plan (JSON)."),
    Variable(protocol.RESTORE_URI, "none", JOB, "The checkpoint a relaunch restores."),
    Variable(protocol.RESTORE_STEP, "none", JOB, "Its step."),
    Variable(protocol.PLAN_ID, "none", JOB, "The plan's id (reported with `resume.loaded`)."),
    Variable("CKPT_HA_RESTORE_STORAGE_WAIT_S", f"`{RESTORE_STORAGE_WAIT_S:g}`",
             "training process (`sdk.resume()`)",
             "How long a restore waits for unavailable storage before it fails."),
    Variable("`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_*`", "unset (no tracing)",
             "every service, `ckpt-ha run`, the SDK",
             "OpenTelemetry export, the standard variables (see "
             "[Tracing](OBSERVABILITY.md#tracing))."),
    Variable("`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_*`", "AWS, the default chain",
             "whatever touches `s3://` storage",
             "S3 endpoint and credentials, the standard variables (see "
             "[Running against S3](DEPLOY.md#running-against-s3))."),
)  # fmt: skip
"""Variables that are not fields of a settings class. An empty meaning or default adds the
reader to a settings row of the same name."""


def _markdown(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("``", "`")).strip().replace("|", "\\|")


def _default(field: FieldInfo) -> str:
    value: Any = field.default
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "`[" + ", ".join(f"{v:g}" for v in value) + "]`"
    if isinstance(value, float):
        return f"`{value:g}`"
    text = str(value).replace(str(Path.home()), "~")
    return f"`{text}`"


def _name(field_name: str, field: FieldInfo) -> str:
    alias = field.validation_alias
    name = alias if isinstance(alias, str) else f"CKPT_HA_{field_name.upper()}"
    if is_secret(field.annotation):
        return f"`{name}` / `{name}_FILE`"
    return f"`{name}`"


def settings_variables() -> list[Variable]:
    """One per field of the settings classes; a field two services share is one row."""
    classes: list[tuple[str, type[ServiceSettings]]] = [(EVERY, ServiceSettings)]
    classes += [(f"{name}", entry.settings) for name, entry in entries().items()]
    classes.append(("`ckpt-ha run`", RunnerSettings))
    rows: dict[str, Variable] = {}
    for reader, cls in classes:
        for field_name, field in cls.model_fields.items():
            if reader != EVERY and field_name in ServiceSettings.model_fields:
                continue
            if not field.description:
                raise ValueError(f"{cls.__name__}.{field_name} has no docstring")
            name = _name(field_name, field)
            meaning = _markdown(field.description)
            row = rows.get(name)
            if row is None:
                rows[name] = Variable(name, _default(field), reader, meaning)
                continue
            row.read_by += f", {reader}"
            if meaning != row.meaning:
                row.meaning += f"; {reader}: {meaning}"
    return list(rows.values())


def variables() -> list[Variable]:
    rows = settings_variables()
    by_plain = {r.name.split("`")[1]: r for r in rows}
    for other in OTHER_VARIABLES:
        row = by_plain.get(other.name)
        if row is not None:
            row.read_by += f"; {other.read_by}"
            if other.meaning:
                row.meaning += f" {other.meaning}"
            continue
        name = other.name if other.name.startswith("`") else f"`{other.name}`"
        rows.append(Variable(name, other.default, other.read_by, other.meaning))
    return rows


def render() -> str:
    rows = [(v.name, v.default, v.read_by, v.meaning) for v in variables()]
    return doc_tables.block(NAME, ("variable", "default", "read by", "meaning"), rows)


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    return doc_tables.main([*(["--check"] if check else []), NAME])


if __name__ == "__main__":
    raise SystemExit(main())
