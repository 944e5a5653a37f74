"""The behaviour every watch-state store (`ckpt_ha.writer_watcher.ports.WatchStateStore`) must
show, run against the in-memory fake and the Redis adapter.

Subclass `WatchStateContract` and give it an ``open_state`` fixture: a function of a storage
root's URI that opens a fresh store instance (a restarted watcher) on one shared backend.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ckpt_ha.writer_watcher.domain import Tracked, WatchState

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
ROOT = "file:///data/root-a"

OpenState = Callable[[str], Any]


def tracked(cid: str, phase: str = "writing", size: int = 10) -> Tracked:
    return Tracked(
        checkpoint_id=cid,
        first_seen=T0,
        last_change=T0 + timedelta(seconds=size),
        signature=(("a.bin", size), ("b/c.bin", 2 * size)),
        phase=phase,
        uri=f"{ROOT}/job-1/{cid}",
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )


class WatchStateContract:
    @pytest.fixture
    def open_state(self) -> OpenState:
        raise NotImplementedError("implementation test classes provide open_state")

    async def test_a_new_root_has_no_state(self, open_state: OpenState) -> None:
        state = await open_state(ROOT).load()
        assert state.folders == {}

    async def test_what_was_saved_survives_a_restart(self, open_state: OpenState) -> None:
        first = open_state(ROOT)
        await first.load()
        saved = {"job-1/step-1": tracked("c1"), "job-1/step-2": tracked("c2", "committed")}
        await first.save(WatchState(dict(saved)))
        assert (await open_state(ROOT).load()).folders == saved

    async def test_changes_and_vanished_folders_are_saved(self, open_state: OpenState) -> None:
        store = open_state(ROOT)
        await store.load()
        await store.save(WatchState({"f1": tracked("c1"), "f2": tracked("c2")}))
        state = await store.load()
        state.folders["f1"] = tracked("c1", "committed", size=11)
        del state.folders["f2"]
        state.folders["f3"] = tracked("c3")
        await store.save(state)
        assert (await open_state(ROOT).load()).folders == {
            "f1": tracked("c1", "committed", size=11),
            "f3": tracked("c3"),
        }

    async def test_each_root_has_its_own_state(self, open_state: OpenState) -> None:
        a, b = open_state(ROOT), open_state("file:///data/root-b")
        await a.load()
        await b.load()
        await a.save(WatchState({"f1": tracked("c1")}))
        await b.save(WatchState({"f9": tracked("c9")}))
        assert set((await open_state(ROOT).load()).folders) == {"f1"}
        assert set((await open_state("file:///data/root-b").load()).folders) == {"f9"}
