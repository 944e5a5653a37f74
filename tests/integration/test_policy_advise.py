"""`ckpt-ha policy advise` (R3) through the real CLI process: explicit numbers, and `--job`
measured from registry records (written by the real `Registry.apply_many`) and the restore
coordinator's failure log in Redis (written by its owner, `RedisRestores`). Every expected
number is worked out here by hand from the documented formulas."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointVerifiedV1,
    CheckpointWritingV1,
)
from ckpt_ha.core.records import Applied
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.restore_coordinator.records import Failure
from ckpt_ha.restore_coordinator.store import RedisRestores
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.cli_tools import cli

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
PRIOR_S = 24 * 3600.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def young(s: float, m: float) -> float:
    return math.sqrt(2 * s * m)


def daly(s: float, m: float) -> float:
    if s >= 2 * m:
        return m
    return math.sqrt(2 * s * m) * (1 + math.sqrt(s / (2 * m)) / 3 + s / (2 * m) / 9) - s


def waste(tau: float, s: float, m: float, r: float = 0.0) -> float:
    return s / tau + (tau + s) / (2 * m) + r / m


def _writing(job: str, ckpt: str, step: int, when: datetime) -> Envelope[EventData]:
    data = CheckpointWritingV1(
        job_id=job,
        checkpoint_id=ckpt,
        uri=f"file:///data/{job}/step-{step}",
        run_id="run-1",
        step=step,
        format=CheckpointFormat.NATIVE,
    )
    return build(data, source="test/sdk", time=when, key=f"w-{ckpt}")


def _committed(
    job: str, ckpt: str, step: int, when: datetime, started: datetime | None = None
) -> Envelope[EventData]:
    identity = None
    if started is not None:
        identity = CheckpointIdentity(job_id=job, run_id="run-1", created_at=started)
    data = CheckpointCommittedV1(
        job_id=job,
        checkpoint_id=ckpt,
        uri=f"file:///data/{job}/step-{step}",
        run_id="run-1",
        step=step,
        format=CheckpointFormat.NATIVE,
        identity=identity,
        shard_count=2,
        total_bytes=1_000_000,
    )
    return build(data, source="test/sdk", time=when, key=f"c-{ckpt}")


def _verified(job: str, ckpt: str, step: int, when: datetime) -> Envelope[EventData]:
    data = CheckpointVerifiedV1(
        job_id=job, checkpoint_id=ckpt, uri=f"file:///data/{job}/step-{step}", checks=("sizes",)
    )
    return build(data, source="test/checker", time=when, key=f"v-{ckpt}")


@pytest.fixture
async def registry(settings: ServiceSettings) -> AsyncIterator[Registry]:
    reg = Registry.from_url(settings.redis_url, settings.registry_prefix)
    yield reg
    await reg.close()


async def _apply(registry: Registry, events: list[Envelope[EventData]]) -> None:
    results = await registry.apply_many(events)
    assert all(isinstance(r, Applied) and not r.duplicate for r in results), results


async def test_explicit_numbers_text_and_json(settings: ServiceSettings, tmp_path: Path) -> None:
    args = ("policy", "advise", "--write-seconds", "50", "--mtbf-hours", str(10_000 / 3600))
    code, out, err = await cli(settings, tmp_path, *args, "--restart-seconds", "100",
                               "--current-interval-seconds", "400", "--checkpoint-bytes", "1e9",
                               "--keep", "3", "--json")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    # sqrt(2·50·10 000) = 1000; Daly: 1000·(1 + 0.05/3 + 0.0025/9) - 50
    assert doc["young_seconds"] == pytest.approx(1000.0)
    assert doc["daly_seconds"] == pytest.approx(966.9444444, rel=1e-9)
    assert doc["waste_young"] == pytest.approx(0.1125)  # 0.05 + 0.0525 + 0.01
    assert doc["waste_current"] == pytest.approx(0.1575)  # 0.125 + 0.0225 + 0.01
    assert doc["waste_advised"] == pytest.approx(waste(966.9444444, 50, 10_000, 100))
    assert doc["storage_current"]["checkpoints_per_day"] == pytest.approx(192.0)  # 86400/450
    assert doc["storage_current"]["bytes_per_day"] == pytest.approx(192e9)
    assert doc["storage_advised"]["steady_state_bytes"] == pytest.approx(3e9)
    assert doc["verdict"] == "adjust"
    assert doc["estimates"] is True
    assert "outside [0.5x, 2x]" in doc["warnings"][0]

    code, out, err = await cli(settings, tmp_path, *args, "--current-interval-seconds", "400")
    assert code == 0, err
    assert "Daly (advised)   967 s (16.1 min)" in out
    assert "10.26%" in out  # R = 0: 50/966.9 + 1016.9/20 000
    assert "warning: the current interval (400 s)" in out
    assert "verdict: adjust" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--write-seconds", "10", "--mtbf-hours", "0"), "--mtbf-hours: must be > 0"),
        (("--write-seconds", "-3", "--mtbf-hours", "1"), "--write-seconds: must be > 0"),
        (("--write-seconds", "10", "--mtbf-hours", "1", "--restart-seconds", "-1"), "must be >= 0"),
        (("--write-seconds", "10", "--mtbf-hours", "1", "--keep", "0"), "--keep: must be >= 1"),
        (("--write-seconds", "10"), "give --job J, or --mtbf-hours"),
        (("--mtbf-hours", "abc"), "'abc' is not a number"),
    ],
)
async def test_bad_inputs_exit_2_with_one_line(
    settings: ServiceSettings, tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    code, out, err = await cli(settings, tmp_path, "policy", "advise", *args)
    assert code == 2
    assert out == ""
    assert needle in err
    assert len(err.strip().splitlines()) == 1


async def test_write_time_at_least_mtbf_is_a_clear_verdict(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    code, out, err = await cli(settings, tmp_path, "policy", "advise", "--write-seconds", "7200",
                               "--mtbf-hours", "1", "--json")  # fmt: skip
    assert code == 1, err
    doc = json.loads(out)
    assert doc["verdict"] == "unworkable"
    assert doc["daly_seconds"] == 3600  # S >= 2M: tau = M
    assert doc["young_seconds"] == pytest.approx(7200.0)  # sqrt(2·7200·3600)
    assert "mean time between failures" in doc["warnings"][0]


async def test_job_measured_from_registry_and_coordinator_failures(
    settings: ServiceSettings, registry: Registry, tmp_path: Path
) -> None:
    # Four checkpoints of one run, a write every 600 s, each write 30 s, verified 5 s later.
    events: list[Envelope[EventData]] = []
    for k in range(4):
        start = 600 * k
        ck = f"a-{k}"
        events += [
            _writing("job-a", ck, 100 * k, at(start)),
            _committed("job-a", ck, 100 * k, at(start + 30)),
            _verified("job-a", ck, 100 * k, at(start + 35)),
        ]
    await _apply(registry, events)
    # One failure at 2000 s, recorded as the restore coordinator records a job.failed.
    state = RedisRestores.from_url(settings.redis_url, settings.registry_prefix)
    try:
        await state.failure_context("job-a", 1, Failure(1, at(2000), "exit:1"), None, 3)
    finally:
        await state.close()

    code, out, err = await cli(settings, tmp_path, "policy", "advise", "--job", "job-a",
                               "--keep", "3", "--restart-seconds", "60", "--json")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    s_ = 30.0
    span = 2000.0  # first write start (0) to the failure (2000)
    m = (span + PRIOR_S) / (1 + 1)  # one failure, prior worth one: 44 200 s
    current = 600 - s_  # spacing of starts minus the write time
    assert doc["write_seconds"] == pytest.approx(s_)
    assert doc["mtbf_seconds"] == pytest.approx(m)
    assert doc["current_interval_seconds"] == pytest.approx(current)
    assert doc["young_seconds"] == pytest.approx(young(s_, m))
    assert doc["daly_seconds"] == pytest.approx(daly(s_, m))
    assert doc["waste_current"] == pytest.approx(waste(current, s_, m, 60))
    assert doc["waste_advised"] == pytest.approx(waste(daly(s_, m), s_, m, 60))
    assert doc["checkpoint_bytes"] == 1_000_000
    per_day = 86_400 / (daly(s_, m) + s_)
    assert doc["storage_advised"]["checkpoints_per_day"] == pytest.approx(per_day)
    assert doc["storage_advised"]["bytes_per_day"] == pytest.approx(per_day * 1e6)
    assert doc["storage_advised"]["steady_state_bytes"] == pytest.approx(3e6)
    assert doc["storage_current"]["checkpoints_per_day"] == pytest.approx(86_400 / 600)
    # Daly here is about 1600 s: 570 s is 0.36x of it.
    assert doc["verdict"] == "adjust"
    notes = " ".join(doc["notes"])
    assert "1 failure(s)" in notes
    assert "coord:failures:job-a" in notes
    assert "median of 4 measured writes" in notes

    code, out, err = await cli(settings, tmp_path, "policy", "advise", "--job", "job-a")
    assert code == 0, err
    assert out.startswith("job job-a: checkpoint interval advice")
    assert "note: only 1 failure(s) observed" in out
    assert "verdict: adjust" in out


async def test_job_without_writing_events_or_failures_uses_identity_and_prior(
    settings: ServiceSettings, registry: Registry, tmp_path: Path
) -> None:
    # As when the writer-watcher's commit was heard before the SDK's `writing`: only commits,
    # whose identity carries the writer's clock at the start of the save (12 s before).
    events: list[Envelope[EventData]] = []
    for k in range(3):
        commit = 1000 * k
        ck = f"b-{k}"
        events += [
            _committed("job-b", ck, 10 * k, at(commit), started=at(commit - 12)),
            _verified("job-b", ck, 10 * k, at(commit + 3)),
        ]
    await _apply(registry, events)

    code, out, err = await cli(settings, tmp_path, "policy", "advise", "--job", "job-b", "--json")
    assert code == 0, err
    doc = json.loads(out)
    m = 2012 + PRIOR_S  # no failure: observed span (-12 s .. 2000 s) plus the prior
    assert doc["write_seconds"] == pytest.approx(12.0)
    assert doc["mtbf_seconds"] == pytest.approx(m)
    assert doc["current_interval_seconds"] == pytest.approx(1000 - 12)
    assert doc["daly_seconds"] == pytest.approx(daly(12, m))
    assert any("no failure observed yet" in n for n in doc["notes"])
    assert any("restart time not measured" in n for n in doc["notes"])

    # An explicit option overrides what was measured.
    code, out, err = await cli(settings, tmp_path, "policy", "advise", "--job", "job-b",
                               "--mtbf-hours", "10", "--json")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["mtbf_seconds"] == 36_000
    assert doc["young_seconds"] == pytest.approx(young(12, 36_000))  # sqrt(864 000)


async def test_unknown_job_is_one_line_exit_1(settings: ServiceSettings, tmp_path: Path) -> None:
    code, out, err = await cli(settings, tmp_path, "policy", "advise", "--job", "nope")
    assert code == 1
    assert out == ""
    assert err.strip() == "ckpt-ha: no checkpoints registered for job nope: nothing to measure"
