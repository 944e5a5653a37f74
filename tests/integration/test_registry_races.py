"""Two registry replicas racing on one checkpoint never both apply a transition."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointState, CheckpointWriteFailedV1, FailureSide
from ckpt_ha.core.lifecycle import IllegalTransition
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.events import T0, committed, verified

pytestmark = pytest.mark.integration


def write_failed(ckpt: str):  # type: ignore[no-untyped-def]
    return build(
        CheckpointWriteFailedV1(
            job_id="job-1",
            checkpoint_id=ckpt,
            uri="file:///x",
            reason="shard 3 missing",
            side=FailureSide.JOB,
        ),
        source="test/watcher",
        time=T0 + timedelta(seconds=6),
        key="k",
    )


async def test_conflicting_transitions_race_and_exactly_one_wins(
    settings: ServiceSettings,
) -> None:
    a = Registry.from_url(settings.redis_url, settings.registry_prefix)
    b = Registry.from_url(settings.redis_url, settings.registry_prefix)
    try:
        for i in range(40):
            ckpt = f"race-{i}"
            await a.apply(committed(ckpt))
            # pending_verification -> valid and -> write_failed are both legal, but not both.
            results = await asyncio.gather(
                a.apply(verified(ckpt)), b.apply(write_failed(ckpt)), return_exceptions=True
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            assert len(errors) == 1, results
            assert isinstance(errors[0], IllegalTransition)
            record = await a.get(ckpt)
            assert record is not None
            assert record.state in (CheckpointState.VALID, CheckpointState.WRITE_FAILED)
            assert len(record.history) == 2
            assert await a.indexed_states(ckpt) == [record.state]
    finally:
        await a.close()
        await b.close()


async def test_the_same_event_raced_by_two_replicas_is_applied_once(
    settings: ServiceSettings,
) -> None:
    a = Registry.from_url(settings.redis_url, settings.registry_prefix)
    b = Registry.from_url(settings.redis_url, settings.registry_prefix)
    try:
        for i in range(40):
            ckpt = f"dup-{i}"
            await a.apply(committed(ckpt))
            event = verified(ckpt)
            results = await asyncio.gather(a.apply(event), b.apply(event))
            assert sorted(r.duplicate for r in results) == [False, True]
            record = await b.get(ckpt)
            assert record is not None
            assert [h.event_id for h in record.history].count(event.id) == 1
    finally:
        await a.close()
        await b.close()
