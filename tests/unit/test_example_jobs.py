"""The example jobs resume bit for bit: after restoring the checkpoint at step k, every later
step's loss has exactly the float64 bits of the uninterrupted run (same seed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ckpt_ha import sdk
from ckpt_ha.contracts.resume import Compatibility, ResumeMode, ResumePlannedV2
from ckpt_ha.lab.examples import numpy_mlp
from tests.support.resume_tools import bits, plan_for

Losses = list[tuple[int, float]]
Train = Callable[..., Losses]
CFG = numpy_mlp.Config(steps=60, checkpoint_every=10, seed=3)


def ctx(root: Path, job: str, attempt: int = 1, plan: ResumePlannedV2 | None = None) -> sdk.Context:
    return sdk.Context(job, "run-1", attempt, str(root), None, plan=plan)


def interrupted_then_resumed(
    train: Train, tmp_path: Path, job: str, stop_at: int, resume_step: int
) -> tuple[Losses, Losses]:
    """Run A uninterrupted; run B stopped at ``stop_at``, then resumed from ``resume_step``."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    uninterrupted = train(CFG, ctx(tmp_path / "a", job))
    first = train(CFG, ctx(tmp_path / "b", job), stop_at=stop_at)
    assert first[-1][0] == stop_at
    plan = plan_for(tmp_path / "b", job, resume_step)
    resumed = train(CFG, ctx(tmp_path / "b", job, 2, plan))
    return uninterrupted, resumed


def assert_bit_for_bit(
    uninterrupted: list[tuple[int, float]], resumed: list[tuple[int, float]], resume_step: int
) -> None:
    expected = {step: bits(loss) for step, loss in uninterrupted}
    assert [step for step, _ in resumed] == list(range(resume_step + 1, CFG.steps + 1))
    assert {step: bits(loss) for step, loss in resumed} == {
        s: b for s, b in expected.items() if s > resume_step
    }


def test_numpy_job_resumes_bit_for_bit(tmp_path: Path) -> None:
    uninterrupted, resumed = interrupted_then_resumed(numpy_mlp.train, tmp_path, "np-job", 47, 40)
    assert_bit_for_bit(uninterrupted, resumed, 40)
    # The run really learns (the check is not about a constant loss) and crosses epochs.
    assert uninterrupted[-1][1] < uninterrupted[0][1] / 2
    assert CFG.steps * CFG.batch_size > numpy_mlp.SAMPLES


def test_numpy_checkpoint_holds_the_whole_training_state(tmp_path: Path) -> None:
    numpy_mlp.train(CFG, ctx(tmp_path, "np-state"), stop_at=20)
    state = sdk.load(str(tmp_path / "np-state" / "step-00000020"), tensors="numpy").state
    assert state["step"] == 20
    assert state["optimizer"]["t"] == 20
    assert set(state["optimizer"]["m"]) == {"w1", "b1", "w2", "b2"}
    assert state["loader"]["epoch"] == 1  # 20 batches of 32 crossed the 512-sample epoch
    assert state["loader"]["order"].shape == (numpy_mlp.SAMPLES,)
    # The full PCG64 state (128-bit integers included) survives, so the stream continues exactly.
    gen = np.random.Generator(np.random.PCG64())
    gen.bit_generator.state = state["rng"]
    assert state["rng"]["bit_generator"] == "PCG64"
    assert state["rng"]["state"]["state"] > 2**64


def test_a_checkpoint_of_another_seed_does_not_continue_the_run(tmp_path: Path) -> None:
    """The comparison above can fail: another seed's checkpoint gives other losses."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    reference = numpy_mlp.train(CFG, ctx(tmp_path / "a", "np-seed"))
    other = numpy_mlp.Config(steps=60, checkpoint_every=10, seed=4)
    numpy_mlp.train(other, ctx(tmp_path / "b", "np-seed"), stop_at=30)
    plan = plan_for(tmp_path / "b", "np-seed", 30)
    resumed = numpy_mlp.train(CFG, ctx(tmp_path / "b", "np-seed", 2, plan))
    assert [bits(loss) for s, loss in reference if s > 30] != [bits(loss) for _, loss in resumed]


@pytest.mark.parametrize("flag", ["--crash-after-resume", "--crash-at-step"])
def test_crash_options_exit_non_zero(tmp_path: Path, flag: str) -> None:
    numpy_mlp.train(CFG, ctx(tmp_path, "np-crash"), stop_at=10)
    plan = plan_for(tmp_path, "np-crash", 10)
    cfg, _ = numpy_mlp.parse(
        ["--steps", "60", flag, *(["12"] if flag == "--crash-at-step" else [])]
    )
    with pytest.raises(SystemExit, match="crash requested"):
        numpy_mlp.train(cfg, ctx(tmp_path, "np-crash", 2, plan))


def test_a_weights_only_plan_takes_the_weights_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    reference = numpy_mlp.train(CFG, ctx(tmp_path / "a", "np-w"))
    numpy_mlp.train(CFG, ctx(tmp_path / "b", "np-w"), stop_at=30)
    plan = plan_for(tmp_path / "b", "np-w", 30).model_copy(
        update={"mode": ResumeMode.WEIGHTS_ONLY, "compatibility": Compatibility.UNKNOWN}
    )
    weights_only = numpy_mlp.train(CFG, ctx(tmp_path / "b", "np-w", 2, plan))
    assert weights_only[0][0] == 31  # numbering goes on ...
    # ... but with a fresh optimizer and data order the trajectory is a different one.
    assert bits(weights_only[0][1]) != bits(dict(reference)[31])
