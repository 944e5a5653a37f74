"""The Hugging Face Trainer integration (`ckpt_ha.sdk.hf`) with a real Trainer on CPU and the
real broker: sidecars beside every save, announcements once per checkpoint, progress, and a
resume through the Trainer's own loader that is bit-exact, refuses a damaged checkpoint and
starts from the newest complete one after a kill mid-save.

One Trainer run (6 steps, a checkpoint every 2) is shared by the module; tests that resume work
on copies of its folders.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
import torch
from pydantic import SecretStr
from transformers import Trainer

from ckpt_ha import formats, sdk
from ckpt_ha.bus import streams
from ckpt_ha.contracts.checkpoint import CheckpointIdentity, Topology
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import sidecar
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.runner.launch import runtime_environment
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.sdk import hf, protocol
from ckpt_ha.storage import FsStore
from tests.conftest import NATS_URL
from tests.support.bus_tools import SIGNING_KEY, wait_for
from tests.support.hf_tools import BATCH, tiny_trainer
from tests.support.resume_tools import bits, events, plan_for, runner_env

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
JOB = "job-hf"
ENVIRONMENT = runtime_environment(None)


@pytest.fixture(scope="module")
def bus_settings() -> Iterator[ServiceSettings]:
    """A private prefix and streams for the whole module (the shared run publishes once)."""
    unique = uuid.uuid4().hex[:10]
    settings = ServiceSettings(
        NATS_URL=NATS_URL,
        subject_prefix=f"t{unique}",
        events_stream=f"EV_{unique}",
        dead_letter_stream=f"DLQ_{unique}",
        progress_stream=f"PR_{unique}",
        signing_key=SecretStr(SIGNING_KEY),
    )

    async def declare() -> None:
        nc = await nats.connect(settings.nats_url)
        await streams.provision(nc.jetstream(), settings.bus())
        await nc.close()

    async def delete() -> None:
        nc = await nats.connect(settings.nats_url)
        for stream in (
            settings.events_stream,
            settings.dead_letter_stream,
            settings.progress_stream,
        ):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await nc.jetstream().delete_stream(stream)
        await nc.close()

    asyncio.run(declare())
    yield settings
    asyncio.run(delete())


def attempt_env(settings: ServiceSettings, root: Path, job: str, **extra: str) -> dict[str, str]:
    """A runner's variables, with the environment and topology it reported in job.started."""
    return runner_env(
        settings,
        root,
        job,
        **{
            protocol.ENVIRONMENT: ENVIRONMENT.model_dump_json(),
            protocol.TOPOLOGY: Topology(world_size=1).model_dump_json(),
            protocol.CODE_VERSION: "c0ffee",
            **extra,
        },
    )


@dataclass(frozen=True)
class Run:
    root: Path
    trainer: Trainer
    ctx: sdk.Context

    def folder(self, step: int) -> Path:
        return self.root / JOB / f"checkpoint-{step}"


@pytest.fixture(scope="module")
def base(bus_settings: ServiceSettings, tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("hf")
    ctx = sdk.context(attempt_env(bus_settings, root, JOB))
    assert ctx is not None
    trainer = tiny_trainer(hf.output_dir(ctx), [hf.CkptHaCallback(ctx=ctx)])
    hf.train(trainer, ctx=ctx)
    assert sdk.flush_progress(10)
    return Run(root, trainer, ctx)


def copy_checkpoint(base: Run, step: int, root: Path, job: str) -> None:
    """The base run's checkpoint as another job's folder (file times kept, so ids derive alike)."""
    shutil.copytree(base.folder(step), root / job / f"checkpoint-{step}")


def resumed_ctx(
    settings: ServiceSettings, root: Path, job: str, step: int
) -> tuple[sdk.Context, str, str]:
    plan = plan_for(root, job, step, folder=f"checkpoint-{step}", checkpoint_format="hf_trainer")
    env = attempt_env(settings, root, job, **{protocol.RESUME_PLAN: plan.model_dump_json()})
    ctx = sdk.context(env)
    assert ctx is not None
    return ctx, plan.plan_id, plan.checkpoint_id


async def at_least(found: Awaitable[list[dict[str, object]]], n: int) -> list[dict[str, object]]:
    reports = await found
    return reports if len(reports) >= n else []


def same_weights(a: Trainer, b: Trainer) -> bool:
    theirs = b.model.state_dict()
    return all(torch.equal(tensor, theirs[name]) for name, tensor in a.model.state_dict().items())


def losses(trainer: Trainer) -> dict[int, int]:
    return {h["step"]: bits(h["loss"]) for h in trainer.state.log_history if "loss" in h}


def test_output_dir_is_the_jobs_folder_under_the_storage_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = sdk.Context("job-o", "r1", 1, tmp_path.as_uri(), None)
    assert hf.output_dir(ctx) == str(tmp_path / "job-o")
    assert hf.output_dir(root=str(tmp_path), job="j") == str(tmp_path / "j")
    monkeypatch.delenv(protocol.JOB, raising=False)
    with pytest.raises(ValueError, match="outside a runner"):
        hf.output_dir()
    with pytest.raises(ValueError, match="not a local folder"):
        hf.output_dir(root="s3://bucket/ckpts", job="j")


def test_each_save_writes_the_intent_first_and_the_commit_last(base: Run) -> None:
    store = FsStore(base.root)
    assert sorted(p.name for p in (base.root / JOB).iterdir()) == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6"
    ]  # fmt: skip
    hashes = set()
    for step in (2, 4, 6):
        prefix = f"{JOB}/checkpoint-{step}"
        listed = {i.key.rsplit("/", 1)[1]: i for i in store.list(f"{prefix}/")}
        times = [i.mtime for i in listed.values()]
        assert listed[sidecar.INTENT].mtime == min(times)  # first: it fixes the checkpoint id
        assert listed[sidecar.COMMIT].mtime == max(times)  # last: after the Trainer's files
        intent = sidecar.read_intent(store, prefix)
        commit = sidecar.read_commit(store, prefix)
        assert intent is not None
        assert commit is not None
        identity = intent.identity
        assert (identity.job_id, identity.run_id, identity.attempt) == (JOB, "run-1", 2)
        assert identity.code_version == "c0ffee"
        assert identity.environment == ENVIRONMENT  # as the runner reported it in job.started
        assert identity.topology == Topology(world_size=1)
        assert (intent.format, intent.step, intent.world_size) == ("hf_trainer", step, 1)
        hashes.add(identity.config_hash)

        assert set(commit.files) == set(listed) - sidecar.NAMES
        assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(
            commit.files
        )
        for name, evidence in commit.files.items():
            digest, size = cs.checksum(store, f"{prefix}/{name}", cs.WRITE_ALGORITHM)
            assert (
                (evidence.size, evidence.checksum) == (listed[name].size, digest) == (size, digest)
            )
        assert (commit.step, commit.exact_resume, commit.data_position) == (
            step,
            True,
            step * BATCH,
        )

        report = formats.verify(store, prefix)
        assert report.ok, report.reasons
        assert (report.format, report.step, report.exact_resume) == ("hf_trainer", step, True)
    [config_hash] = hashes
    assert config_hash is not None
    assert config_hash.startswith("sha256:")


async def test_each_checkpoint_is_announced_once_writing_and_once_committed(
    base: Run, bus_settings: ServiceSettings
) -> None:
    store = FsStore(base.root)
    ids = {checkpoint_id_on(store, f"{JOB}/checkpoint-{s}"): s for s in (2, 4, 6)}
    writing = await wait_for(
        lambda: at_least(events(bus_settings, "checkpoint.writing", JOB), 3), what="3 writing"
    )
    committed = await wait_for(
        lambda: at_least(events(bus_settings, "checkpoint.committed", JOB), 3), what="3 committed"
    )
    assert sorted((e["checkpoint_id"], e["step"]) for e in writing) == sorted(ids.items())
    assert sorted((e["checkpoint_id"], e["step"]) for e in committed) == sorted(ids.items())
    for event in committed:
        assert (event["format"], event["run_id"]) == ("hf_trainer", "run-1")
        intent = sidecar.read_intent(store, f"{JOB}/checkpoint-{event['step']}")
        assert intent is not None
        assert CheckpointIdentity.model_validate(event["identity"]) == intent.identity
        assert event["uri"] == store.uri(f"{JOB}/checkpoint-{event['step']}")


async def test_progress_reports_loss_learning_rate_and_samples_seen(
    base: Run, bus_settings: ServiceSettings
) -> None:
    reports = await wait_for(
        lambda: at_least(events(bus_settings, "job.progress", JOB), 6), what="6 job.progress"
    )
    logged = {h["step"]: h for h in base.trainer.state.log_history if "loss" in h}
    assert sorted(r["step"] for r in reports) == [1, 2, 3, 4, 5, 6]  # one per step
    for report in reports:
        step = report["step"]
        metrics = report["metrics"]
        assert isinstance(step, int)
        assert isinstance(metrics, dict)
        assert metrics["loss"] == logged[step]["loss"]
        assert metrics["learning_rate"] == logged[step]["learning_rate"]
        assert (report["data_position"], report["attempt"]) == (step * BATCH, 2)
    assert (base.root / "progress").read_text() == "6\n"


async def test_train_with_a_plan_resumes_at_its_step_and_continues_bit_exact(
    base: Run, bus_settings: ServiceSettings, tmp_path: Path
) -> None:
    job = "job-hf-resume"
    copy_checkpoint(base, 4, tmp_path, job)
    ctx, plan_id, checkpoint_id = resumed_ctx(bus_settings, tmp_path, job, 4)
    resumed = tiny_trainer(hf.output_dir(ctx))  # hf.train adds the callback

    assert hf.train(resumed, ctx=ctx).global_step == 6

    assert same_weights(resumed, base.trainer)
    assert {s: b for s, b in losses(resumed).items() if s > 4} == {
        s: b for s, b in losses(base.trainer).items() if s > 4
    }
    store = FsStore(tmp_path)
    again = sidecar.read_commit(store, f"{job}/checkpoint-6")
    before = sidecar.read_commit(FsStore(base.root), f"{JOB}/checkpoint-6")
    assert again is not None
    assert before is not None
    assert again.files["model.safetensors"] == before.files["model.safetensors"]  # same bytes
    intent = sidecar.read_intent(store, f"{job}/checkpoint-6")
    first = sidecar.read_intent(FsStore(base.root), f"{JOB}/checkpoint-6")
    assert intent is not None
    assert first is not None
    assert intent.identity.config_hash == first.identity.config_hash

    [loaded] = await wait_for(lambda: events(bus_settings, "resume.loaded", job), what="loaded")
    assert (loaded["plan_id"], loaded["checkpoint_id"]) == (plan_id, checkpoint_id)
    assert (loaded["step"], loaded["attempt"], loaded["data_position"]) == (4, 2, 4 * BATCH)
    assert await events(bus_settings, "resume.load_failed", job) == []


async def test_a_plan_whose_weights_are_damaged_fails_blaming_the_checkpoint(
    base: Run, bus_settings: ServiceSettings, tmp_path: Path
) -> None:
    job = "job-hf-corrupt"
    copy_checkpoint(base, 4, tmp_path, job)
    ctx, plan_id, checkpoint_id = resumed_ctx(bus_settings, tmp_path, job, 4)
    weights = tmp_path / job / "checkpoint-4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8] ^= 0xFF  # the header's first byte: the file no longer parses
    weights.write_bytes(bytes(data))
    trainer = tiny_trainer(hf.output_dir(ctx))

    with pytest.raises(sdk.ResumeFailed, match=f"cannot resume from checkpoint {checkpoint_id}"):
        hf.train(trainer, ctx=ctx)

    [failed] = await wait_for(lambda: events(bus_settings, "resume.load_failed", job), what="lf")
    assert failed["plan_id"] == plan_id
    assert (failed["blame"], failed["side"]) == ("checkpoint", "infrastructure")
    assert "model.safetensors" in str(failed["reason"])
    assert trainer.state.global_step == 0  # never trained on
    assert sorted(p.name for p in (tmp_path / job).iterdir()) == ["checkpoint-4"]
    assert await events(bus_settings, "resume.loaded", job) == []


async def test_damage_the_trainer_would_load_without_noticing_fails_before_the_load(
    base: Run, bus_settings: ServiceSettings, tmp_path: Path
) -> None:
    """A flipped byte in the weights' data would load without error: the verification, run
    before the Trainer's load, fails the resume before the Trainer loads anything."""
    job = "job-hf-flipped"
    copy_checkpoint(base, 4, tmp_path, job)
    ctx, plan_id, _ = resumed_ctx(bus_settings, tmp_path, job, 4)
    weights = tmp_path / job / "checkpoint-4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF  # inside the last tensor's bytes: the file still parses and loads
    weights.write_bytes(bytes(data))
    trainer = tiny_trainer(hf.output_dir(ctx))

    with pytest.raises(sdk.ResumeFailed, match="checksum"):
        hf.train(trainer, ctx=ctx)

    [failed] = await wait_for(lambda: events(bus_settings, "resume.load_failed", job), what="lf")
    assert (failed["plan_id"], failed["blame"]) == (plan_id, "checkpoint")
    assert "model.safetensors" in str(failed["reason"])
    assert trainer.state.global_step == 0  # never loaded, never trained on: no save
    assert sorted(p.name for p in (tmp_path / job).iterdir()) == ["checkpoint-4"]
    assert await events(bus_settings, "resume.loaded", job) == []


async def test_the_trainer_failing_to_load_a_valid_checkpoint_blames_the_attempt(
    base: Run, bus_settings: ServiceSettings, tmp_path: Path
) -> None:
    """R7: this attempt's model no longer fits the checkpoint; the checkpoint stays valid."""
    job = "job-hf-misfit"
    copy_checkpoint(base, 4, tmp_path, job)
    ctx, plan_id, _ = resumed_ctx(bus_settings, tmp_path, job, 4)
    trainer = tiny_trainer(hf.output_dir(ctx), n_embd=16)

    with pytest.raises(sdk.ResumeFailed, match="the Trainer could not load"):
        hf.train(trainer, ctx=ctx)

    [failed] = await wait_for(lambda: events(bus_settings, "resume.load_failed", job), what="lf")
    assert (failed["plan_id"], failed["blame"], failed["side"]) == (plan_id, "attempt", "job")
    assert await events(bus_settings, "resume.loaded", job) == []


async def test_a_trainer_killed_while_saving_resumes_from_the_newest_complete_checkpoint(
    base: Run, bus_settings: ServiceSettings, tmp_path: Path
) -> None:
    job = "job-hf-kill"
    out = tmp_path / job
    log = tmp_path / "trainer.log"
    env = {**os.environ, **attempt_env(bus_settings, tmp_path, job)}
    env.pop(protocol.RESUME_PLAN, None)
    intent = out / "checkpoint-4" / sidecar.INTENT
    with log.open("wb") as sink:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.hf_tools", str(out), "4",
            cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:

            async def intent_written() -> bool:
                assert child.returncode is None, log.read_text()
                return intent.exists()

            await wait_for(intent_written, timeout=60, what="the intent of checkpoint-4")
        finally:
            child.kill()  # SIGKILL: no handler runs, as when the node or the OOM killer stops it
            await child.wait()

    store = FsStore(tmp_path)
    leftover = sorted(i.key for i in store.list(f"{job}/checkpoint-4/"))
    assert leftover == [f"{job}/checkpoint-4/{sidecar.INTENT}"]  # an intent, never a commit
    assert not formats.verify(store, f"{job}/checkpoint-4").ok
    chosen, _ = formats.latest_valid(FsStore(out))
    assert chosen == "checkpoint-2"
    killed_id = checkpoint_id_on(store, f"{job}/checkpoint-4")

    ctx, _, _ = resumed_ctx(bus_settings, tmp_path, job, 2)
    resumed = tiny_trainer(hf.output_dir(ctx))
    assert hf.train(resumed, ctx=ctx).global_step == 6

    assert same_weights(resumed, base.trainer)
    assert checkpoint_id_on(store, f"{job}/checkpoint-4") != killed_id  # a new checkpoint
    assert sidecar.read_commit(store, f"{job}/checkpoint-4") is not None
    assert formats.latest_valid(FsStore(out))[0] == "checkpoint-6"


async def test_code_calling_trainer_train_itself_gets_the_same_checks(
    base: Run, bus_settings: ServiceSettings, tmp_path: Path
) -> None:
    """The documented manual path reports ``resume.loaded``; a resumed attempt that forgets to
    give the Trainer the plan's folder stops before its first step instead of training from 0."""
    for job in ("job-hf-manual", "job-hf-forgot"):
        copy_checkpoint(base, 4, tmp_path, job)
    ctx, plan_id, _ = resumed_ctx(bus_settings, tmp_path, "job-hf-manual", 4)
    manual = tiny_trainer(hf.output_dir(ctx), [hf.CkptHaCallback(ctx=ctx)])
    assert manual.train(resume_from_checkpoint=hf.resume_from_checkpoint(ctx)).global_step == 6
    [loaded] = await wait_for(
        lambda: events(bus_settings, "resume.loaded", "job-hf-manual"), what="loaded"
    )
    assert (loaded["plan_id"], loaded["step"]) == (plan_id, 4)

    ctx, plan_id, _ = resumed_ctx(bus_settings, tmp_path, "job-hf-forgot", 4)
    forgot = tiny_trainer(hf.output_dir(ctx), [hf.CkptHaCallback(ctx=ctx)])
    with pytest.raises(sdk.ResumeFailed, match="starts at step 0, the plan restores step 4"):
        forgot.train()
    [failed] = await wait_for(
        lambda: events(bus_settings, "resume.load_failed", "job-hf-forgot"), what="load_failed"
    )
    assert (failed["plan_id"], failed["blame"], failed["side"]) == (plan_id, "attempt", "job")
    assert forgot.state.global_step == 0
