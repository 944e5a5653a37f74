"""`RecordsOnRead`: a batch of stored records, each parsed when first read, so a reader that
stops early (a restore's selection) never parses the rest."""

from __future__ import annotations

import pydantic
import pytest

from ckpt_ha.core.records import CheckpointRecord, project
from ckpt_ha.registry.lazy_records import RecordsOnRead
from ckpt_ha.restore_coordinator import adapters
from ckpt_ha.restore_coordinator.domain.selection import select
from tests.support.events import committed, verified


def record(cid: str, step: int, *, valid: bool = True) -> CheckpointRecord:
    found, _ = project(None, committed(cid, step=step))
    if valid:
        found, _ = project(found, verified(cid, step=step))
    assert found is not None
    return found


def test_each_record_is_parsed_when_read_and_kept() -> None:
    records = [record("c3", 300, valid=False), record("c2", 200), record("c1", 100)]
    lazy = RecordsOnRead([r.model_dump_json() for r in records])
    assert len(lazy) == 3
    assert lazy[0] == records[0]
    assert lazy[-1] is lazy[2]  # kept: read again, the same object
    assert list(lazy) == records
    assert lazy[1:] == records[1:]
    assert lazy == records
    with pytest.raises(IndexError):
        lazy[3]


def test_a_record_never_read_is_never_parsed() -> None:
    """What lies past the reader's stop may even be unreadable: nothing parses it."""
    lazy = RecordsOnRead(
        [record("c3", 300).model_dump_json(), record("c2", 200).model_dump_json(), "not json"]
    )
    chosen = select((adapters.candidate(r) for r in lazy), set())
    assert chosen.chosen is not None
    assert chosen.previous is not None
    assert (chosen.chosen.checkpoint_id, chosen.previous.checkpoint_id) == ("c3", "c2")
    with pytest.raises(pydantic.ValidationError):
        list(lazy)
