"""`sdk.context`, `sdk.resume` and `sdk.progress` against the real broker.

A resumed attempt reports ``resume.loaded`` (with its data position and RNG fingerprint) or,
when the planned checkpoint cannot be verified, ``resume.load_failed`` and stops with a clear
error; progress reports carry the plan id and reach the runner's progress file even when the
bus is down.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest
from pydantic import SecretStr

from ckpt_ha import sdk
from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts.checkpoint import RuntimeEnvironment, Topology
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.sdk import protocol
from tests.support.bus_tools import wait_for
from tests.support.resume_tools import events, plan_for, runner_env

pytestmark = pytest.mark.integration


def save_one(root: Path, job: str, step: int) -> dict[str, object]:
    state = {"w": np.arange(6, dtype=np.float64), "rng": {"seed": 7, "n": step}, "pos": step * 4}
    sdk.save(str(root), job, step, state, run_id="run-1")
    return state


def test_context_is_none_outside_a_runner() -> None:
    assert sdk.context({}) is None
    assert sdk.context({protocol.RUN_ID: "r1", protocol.NATS_URL: "nats://x:4222"}) is None


def test_context_reads_the_runner_protocol(tmp_path: Path) -> None:
    save_one(tmp_path, "job-c", 10)
    plan = plan_for(tmp_path, "job-c", 10)
    env = {
        protocol.JOB: "job-c",
        protocol.RUN_ID: "r9",
        protocol.ATTEMPT: "3",
        protocol.NATS_URL: "nats://example:4222",
        protocol.SUBJECT_PREFIX: "px",
        protocol.NATS_USER: "runner",
        protocol.NATS_PASSWORD: "secret",
        protocol.RESUME_PLAN: plan.model_dump_json(),
        protocol.ENVIRONMENT: RuntimeEnvironment(python_version="3.11.9").model_dump_json(),
        protocol.TOPOLOGY: Topology(world_size=4).model_dump_json(),
        protocol.CODE_VERSION: "abc123",
    }
    ctx = sdk.context(env)
    assert ctx is not None
    assert (ctx.job_id, ctx.run_id, ctx.attempt, ctx.plan) == ("job-c", "r9", 3, plan)
    assert ctx.bus == sdk.BusEndpoint(
        "nats://example:4222", prefix="px", user="runner", password=SecretStr("secret")
    )
    assert "secret" not in repr(ctx.bus)
    assert ctx.topology == Topology(world_size=4)
    assert ctx.code_version == "abc123"
    with pytest.raises(sdk.BadContext, match="CKPT_HA_ATTEMPT"):
        sdk.context({**env, protocol.ATTEMPT: "two"})
    with pytest.raises(sdk.BadContext, match="CKPT_HA_RESUME_PLAN"):
        sdk.context({**env, protocol.RESUME_PLAN: "{}"})


def test_save_under_a_runner_records_the_attempts_identity(tmp_path: Path) -> None:
    environment = RuntimeEnvironment(framework="numpy", framework_version="1", python_version="3")
    env = {
        protocol.JOB: "job-i",
        protocol.RUN_ID: "r2",
        protocol.ATTEMPT: "4",
        protocol.ENVIRONMENT: environment.model_dump_json(),
        protocol.TOPOLOGY: Topology(world_size=2).model_dump_json(),
        protocol.CODE_VERSION: "v7",
    }
    ctx = sdk.context(env)
    saved = sdk.save(str(tmp_path), "job-i", 5, {"x": np.zeros(2)}, ctx=ctx, whole_state=True)
    identity = saved.manifest.identity
    assert identity is not None
    assert (identity.run_id, identity.attempt, identity.code_version) == ("r2", 4, "v7")
    assert identity.environment == environment
    assert identity.topology == Topology(world_size=2)


@pytest.mark.parametrize(("rank", "whole_state"), [(1, False), (1, True), (0, False)])
def test_save_in_a_multi_rank_job_never_writes_a_partial_checkpoint(
    tmp_path: Path, rank: int, whole_state: bool
) -> None:
    """One rank's part saved natively would be registered as the whole checkpoint."""
    env = {protocol.JOB: "job-m", protocol.RANK: str(rank), protocol.WORLD_SIZE: "2"}
    ctx = sdk.context(env)
    with pytest.raises(sdk.PartialSave, match=r"ckpt_ha\.sdk\.dcp\.save"):
        sdk.save(str(tmp_path), "job-m", 5, {"x": np.zeros(2)}, ctx=ctx, whole_state=whole_state)
    assert list(tmp_path.iterdir()) == []


def test_rank_zero_saves_a_state_it_says_is_whole(tmp_path: Path) -> None:
    """DDP replicas: rank 0 holds the whole state and may save it natively."""
    ctx = sdk.context({protocol.JOB: "job-w", protocol.RANK: "0", protocol.WORLD_SIZE: "2"})
    assert ctx is not None
    assert (ctx.rank, ctx.world_size) == (0, 2)
    saved = sdk.save(str(tmp_path), "job-w", 5, {"x": np.ones(2)}, ctx=ctx, whole_state=True)
    assert sdk.load(saved.uri).step == 5
    with pytest.raises(sdk.BadContext, match="RANK"):
        sdk.context({protocol.JOB: "job-w", protocol.RANK: "2", protocol.WORLD_SIZE: "2"})


async def test_resume_loads_the_plan_and_reports_loaded(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    saved_state = save_one(tmp_path, "job-r", 20)
    plan = plan_for(tmp_path, "job-r", 20)
    env = runner_env(settings, tmp_path, "job-r", **{protocol.RESUME_PLAN: plan.model_dump_json()})
    ctx = sdk.context(env)
    resumed = sdk.resume(describe=lambda s: (s["pos"], sdk.fingerprint(s["rng"])), ctx=ctx)
    assert resumed is not None
    assert resumed.step == 20
    assert resumed.plan == plan
    np.testing.assert_array_equal(resumed.state["w"], saved_state["w"])

    [loaded] = await wait_for(lambda: events(settings, "resume.loaded"), what="resume.loaded")
    assert loaded["plan_id"] == plan.plan_id
    assert loaded["checkpoint_id"] == plan.checkpoint_id
    assert (loaded["step"], loaded["attempt"], loaded["data_position"]) == (20, 2, 80)
    assert loaded["rng_fingerprint"] == sdk.fingerprint({"seed": 7, "n": 20})
    assert isinstance(loaded["load_seconds"], float)


async def test_resume_without_a_plan_is_a_fresh_start(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    assert sdk.resume(ctx=sdk.context(runner_env(settings, tmp_path, "job-f"))) is None


@pytest.mark.parametrize("damage", ["corrupt_shard", "replaced_folder", "missing"])
async def test_resume_of_an_unverifiable_checkpoint_reports_load_failed_and_raises(
    settings: ServiceSettings, producer: Bus, tmp_path: Path, damage: str
) -> None:
    save_one(tmp_path, "job-x", 30)
    plan = plan_for(tmp_path, "job-x", 30)
    folder = tmp_path / "job-x" / "step-00000030"
    if damage == "corrupt_shard":
        shard = next(p for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix == ".npy")
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif damage == "replaced_folder":  # same step, rewritten later: another checkpoint id
        for p in sorted(folder.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        folder.rmdir()
        save_one(tmp_path, "job-x", 30)
    else:
        plan = plan.model_copy(update={"checkpoint_uri": plan.checkpoint_uri + "-gone"})
    ctx = sdk.context(
        runner_env(settings, tmp_path, "job-x", **{protocol.RESUME_PLAN: plan.model_dump_json()})
    )
    with pytest.raises(
        sdk.ResumeFailed, match=f"cannot resume from checkpoint {plan.checkpoint_id}"
    ):
        sdk.resume(ctx=ctx)

    [failed] = await wait_for(
        lambda: events(settings, "resume.load_failed"), what="resume.load_failed"
    )
    assert failed["plan_id"] == plan.plan_id
    assert failed["checkpoint_id"] == plan.checkpoint_id
    assert failed["side"] == "infrastructure"
    assert failed["blame"] == "checkpoint"  # its bytes are damaged or gone: quarantine it
    assert await events(settings, "resume.loaded") == []


async def test_resume_of_a_format_this_loader_does_not_read_blames_the_attempt(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    """R7: the native loader given a DCP plan says so and blames itself, not the checkpoint
    (which the coordinator then keeps valid)."""
    save_one(tmp_path, "job-d", 30)
    plan = plan_for(tmp_path, "job-d", 30).model_copy(update={"checkpoint_format": "torch_dcp"})
    ctx = sdk.context(
        runner_env(settings, tmp_path, "job-d", **{protocol.RESUME_PLAN: plan.model_dump_json()})
    )
    with pytest.raises(sdk.ResumeFailed, match=r"ckpt_ha\.sdk\.dcp\.resume"):
        sdk.resume(ctx=ctx)
    [failed] = await wait_for(
        lambda: events(settings, "resume.load_failed"), what="resume.load_failed"
    )
    assert (failed["blame"], failed["side"]) == ("attempt", "job")
    assert "format torch_dcp" in str(failed["reason"])


async def test_progress_reports_steps_with_the_plan_id_and_writes_the_progress_file(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    save_one(tmp_path, "job-p", 10)
    plan = plan_for(tmp_path, "job-p", 10)
    env = runner_env(settings, tmp_path, "job-p", **{protocol.RESUME_PLAN: plan.model_dump_json()})
    ctx = sdk.context(env)
    for step in (11, 12):
        assert sdk.progress(
            step,
            data_position=step * 32,
            rng_fingerprint=f"fp{step}",
            metrics={"loss": 0.5},
            ctx=ctx,
        )
    assert (tmp_path / "progress").read_text() == "12\n"
    reports = await wait_for(
        lambda: _at_least(events(settings, "job.progress"), 2), what="two job.progress"
    )
    assert [(r["step"], r["data_position"], r["rng_fingerprint"]) for r in reports] == [
        (11, 352, "fp11"),
        (12, 384, "fp12"),
    ]
    assert {r["plan_id"] for r in reports} == {plan.plan_id}
    assert reports[0]["metrics"] == {"loss": 0.5}
    assert reports[0]["attempt"] == 2


async def _at_least(probe: object, n: int) -> list[dict[str, object]]:
    found = await probe  # type: ignore[misc]
    return found if len(found) >= n else []


def test_progress_is_best_effort_when_the_bus_is_down(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    ctx = sdk.Context(
        "job-d",
        "run-1",
        1,
        str(tmp_path),
        sdk.BusEndpoint(f"nats://127.0.0.1:{closed}", timeout_s=1),
        progress_file=str(tmp_path / "progress"),
    )
    started = time.monotonic()
    assert sdk.progress(1, ctx=ctx) is True  # queued: the background publisher tries the bus
    assert sdk.progress(2, ctx=ctx) is True
    assert time.monotonic() - started < 1.0  # no connect attempt on the training thread
    assert (tmp_path / "progress").read_text() == "2\n"
    assert sdk.flush_progress(5) is False  # never published (see test_sdk_progress.py)
    stats = sdk.progress_stats(ctx.bus)
    assert stats is not None
    assert stats.published == 0
