"""The registry remembers applied event ids for a window (``<p>:applied-at``, trimmed by each
write), not forever; a duplicate within the window is still ignored, and one heard after it is
recognised by the record's history, so nothing is applied twice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.events import T0, committed, verified

WINDOW_S = 60.0


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
async def registry(settings: ServiceSettings, clock: Clock) -> AsyncIterator[Registry]:
    registry = Registry(
        connect(settings.redis_url),
        settings.registry_prefix,
        applied_window_s=WINDOW_S,
        clock=clock,
    )
    yield registry
    await registry.close()


def at(event: Envelope[EventData], seconds: float) -> Envelope[EventData]:
    return event.model_copy(update={"time": T0 + timedelta(seconds=seconds)})


async def remembered(registry: Registry) -> set[str]:
    return set(await registry.r.zrange(registry.keys.applied, 0, -1))


async def test_a_duplicate_within_the_window_is_ignored(registry: Registry, clock: Clock) -> None:
    first = at(committed("c1"), 0)
    assert not (await registry.apply(first)).duplicate
    clock.now = T0 + timedelta(seconds=30)
    verdict = at(verified("c1"), 30)
    assert not (await registry.apply(verdict)).duplicate
    assert await remembered(registry) == {first.id, verdict.id}

    clock.now = T0 + timedelta(seconds=WINDOW_S - 1)
    again = await registry.apply_many([first, verdict])
    assert [not isinstance(r, Exception) and r.duplicate for r in again] == [True, True]
    assert await remembered(registry) == {first.id, verdict.id}


async def test_the_applied_ids_are_trimmed_past_the_window_and_a_late_duplicate_changes_nothing(
    registry: Registry, clock: Clock
) -> None:
    first, verdict = at(committed("c1"), 0), at(verified("c1"), 30)
    await registry.apply_many([first, verdict])
    before = await registry.get("c1")

    # Two minutes on, the next write forgets the ids older than the window.
    clock.now = T0 + timedelta(seconds=120)
    other = at(committed("c2", step=200), 120)
    await registry.apply(other)
    assert await remembered(registry) == {other.id}

    # Redelivered (or republished) after the window: the record's history knows them.
    late = await registry.apply_many([first, verdict])
    assert [not isinstance(r, Exception) and r.duplicate for r in late] == [True, True]
    assert await registry.get("c1") == before
    assert await remembered(registry) == {other.id}


async def test_an_event_older_than_the_window_is_not_kept_and_still_applied_once(
    registry: Registry, clock: Clock
) -> None:
    """An event whose own time is already past the window (published late) is applied but not
    remembered as an id; applied again, its record's history still makes it a duplicate."""
    clock.now = T0 + timedelta(hours=2)
    old = at(committed("c1"), 0)
    assert not (await registry.apply(old)).duplicate
    assert await remembered(registry) == set()
    assert (await registry.apply(old)).duplicate
    record = await registry.get("c1")
    assert record is not None
    assert [h.event_id for h in record.history] == [old.id]
