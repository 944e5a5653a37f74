"""`runtime.heap.settle`: start-up objects frozen, the young threshold raised, and garbage made
after it still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ckpt_ha.runtime import heap


@pytest.fixture
def pristine_gc() -> Iterator[None]:
    """The collector as the test found it, afterwards (the suite runs in one process)."""
    threshold = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_settle_freezes_what_start_up_left_and_raises_the_young_threshold(
    pristine_gc: None,
) -> None:
    gc.set_threshold(700, 10, 10)
    survivor = _Node()
    heap.settle()
    assert gc.get_freeze_count() > 0
    assert all(o is not survivor for o in gc.get_objects())  # frozen: walked no more
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, 10, 10)


def test_a_higher_young_threshold_set_by_the_host_is_kept(pristine_gc: None) -> None:
    gc.set_threshold(50_000, 20, 30)
    heap.settle()
    assert gc.get_threshold() == (50_000, 20, 30)


def test_cycles_made_after_settling_are_still_collected(pristine_gc: None) -> None:
    heap.settle()
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: reference counting alone never frees it
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None


def test_start_up_garbage_is_collected_before_the_freeze(pristine_gc: None) -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    heap.settle()
    assert gone() is None  # collected, not frozen for the life of the process
