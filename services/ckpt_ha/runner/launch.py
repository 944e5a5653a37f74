"""What an attempt of `ckpt-ha run` is launched with: the run's spec (`RunSpec`), this
machine as a restore target (`runtime_environment`) and the attempt's environment
(`child_env`: the environment-variable protocol of `ckpt_ha.sdk.context`, the plan to carry
out, the training's own bus credentials and never the runner's).
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import signing
from ckpt_ha.contracts.checkpoint import RuntimeEnvironment, Topology
from ckpt_ha.contracts.job import JobPolicy
from ckpt_ha.contracts.resume import ResumePlannedV1, ResumePlannedV2
from ckpt_ha.credentials import reveal
from ckpt_ha.runner import torchrun
from ckpt_ha.runtime.settings import SIGNING_KEY_ENV
from ckpt_ha.sdk import protocol

NOT_FOR_THE_JOB = frozenset({
    protocol.NATS_USER, protocol.NATS_PASSWORD, protocol.NATS_CA_FILE,
    "CKPT_HA_REDIS_USER", "CKPT_HA_REDIS_PASSWORD",
    "CKPT_HA_JOB_NATS_USER", "CKPT_HA_JOB_NATS_PASSWORD",
})  # fmt: skip
"""The runner's own credentials (and their ``_FILE`` forms): never inherited by the training
process, which gets exactly its own (`child_env`)."""


@dataclass(frozen=True)
class RunSpec:
    job_id: str
    run_id: str
    command: tuple[str, ...]
    storage_root: str
    state_dir: Path
    """Where the runner keeps the progress file and `ckpt_ha.runner.runner.ATTEMPT_FILE`."""
    policy: JobPolicy = field(default_factory=JobPolicy)
    plan_timeout_s: float = 120.0
    max_attempts: int | None = None
    """Stop after this many attempts even if plans keep coming (None: the coordinator decides)."""
    world_size: int = 1
    code_version: str | None = None
    image: str | None = None
    heartbeat_s: float | None = 10.0
    """A ``job.heartbeat`` every this many seconds while an attempt runs (None: none)."""
    deadline_s: float | None = None
    """Silence after which the coordinator declares an attempt lost (None: the tier's)."""
    hang_after_s: float | None = None
    """Silence of the training's progress (outside saves, evaluations and its first steps)
    after which an attempt whose processes live on is hung (`ckpt_ha.runner.hang`): None,
    adaptive (the default); 0: never."""
    resume: bool = False
    """Take over the run: wait for the plan after its last recorded attempt
    (`ckpt_ha.runner.runner.ATTEMPT_FILE`)."""

    @property
    def progress_file(self) -> Path:
        return self.state_dir / "progress"

    def error_file(self, attempt: int) -> Path:
        """Where torchrun writes the failed rank's error for this attempt."""
        return self.state_dir / f"torchrun-error-{attempt}.json"


def runtime_environment(image: str | None) -> RuntimeEnvironment:
    """This machine as a restore target: Python, numpy and torch (when installed), the image.

    The framework is torch when it is installed, else numpy. The SDK records the same
    description in the checkpoints an attempt writes (it gets it through the environment), so
    a restore onto an unchanged machine compares identical.
    """
    libraries: dict[str, str] = {}
    for name in ("numpy", "torch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            libraries[name] = metadata.version(name)
    framework = "torch" if "torch" in libraries else "numpy" if "numpy" in libraries else None
    return RuntimeEnvironment(
        framework=framework,
        framework_version=libraries.get(framework) if framework else None,
        python_version=platform.python_version(),
        image=image,
        libraries=libraries,
    )


def child_env(
    base: Mapping[str, str],
    spec: RunSpec,
    bus: BusConfig,
    attempt: int,
    environment: RuntimeEnvironment,
    plan: ResumePlannedV2 | None,
) -> dict[str, str]:
    """The attempt's environment: ``base`` plus the protocol variables (stale plan ones removed)
    and the attempt's torchrun error file. ``bus`` is the bus as the training process uses it:
    its own NATS user (``job``), never the runner's; the master signing key never reaches it
    either (it gets its job's key only)."""
    stale = (protocol.RESUME_PLAN, protocol.RESTORE_URI, protocol.RESTORE_STEP, protocol.PLAN_ID)
    env = {k: v for k, v in base.items() if k not in stale and not k.startswith(SIGNING_KEY_ENV)
           and k.removesuffix("_FILE") not in NOT_FOR_THE_JOB}  # fmt: skip
    env.update(
        {
            protocol.JOB: spec.job_id,
            protocol.RUN_ID: spec.run_id,
            protocol.ATTEMPT: str(attempt),
            protocol.STORAGE_ROOT: spec.storage_root,
            protocol.PROGRESS_FILE: str(spec.progress_file),
            protocol.NATS_URL: bus.url,
            protocol.SUBJECT_PREFIX: bus.prefix,
            protocol.EVENTS_STREAM: bus.events_stream,
            protocol.ENVIRONMENT: environment.model_dump_json(),
            protocol.TOPOLOGY: Topology(world_size=spec.world_size).model_dump_json(),
            torchrun.ERROR_FILE_ENV: str(spec.error_file(attempt)),
        }
    )
    if spec.code_version is not None:
        env[protocol.CODE_VERSION] = spec.code_version
    if bus.signing_keys:
        env[protocol.JOB_KEY] = signing.job_key(bus.signing_keys[0], spec.job_id).hex()
    if bus.user is not None:
        env[protocol.NATS_USER] = bus.user
        env[protocol.NATS_PASSWORD] = reveal(bus.password) or ""
    if bus.ca_file:
        env[protocol.NATS_CA_FILE] = bus.ca_file
    if plan is not None:
        # The plan as v1 states it: what the job needs to load (the coordinator's bookkeeping
        # v2 adds is not its business), readable by the SDK of an image built before v2.
        env[protocol.RESUME_PLAN] = plan.model_dump_json(include=set(ResumePlannedV1.model_fields))
        env[protocol.RESTORE_URI] = plan.checkpoint_uri
        env[protocol.RESTORE_STEP] = str(plan.step)
        env[protocol.PLAN_ID] = plan.plan_id
    return env
