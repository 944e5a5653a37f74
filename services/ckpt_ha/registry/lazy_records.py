"""Records read in a batch but parsed one at a time, when first read (`RecordsOnRead`).

A restore's selection reads each failing job's newest page of records in one round trip and
usually stops at the second valid one it meets: parsing a record's JSON (its identity,
checksums and history) is most of what reading it costs the client, so the records past the
point where the reader stops are never parsed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from ckpt_ha.core.records import CheckpointRecord


class RecordsOnRead(Sequence[CheckpointRecord]):
    """Stored records (their JSON, in order), each parsed the first time it is read and kept
    (read again: the same object). A sequence like any other: ``len`` parses nothing."""

    __slots__ = ("_parsed", "_raws")

    def __init__(self, raws: Sequence[str | bytes]) -> None:
        self._raws = list(raws)
        self._parsed: list[CheckpointRecord | None] = [None] * len(self._raws)

    def __len__(self) -> int:
        return len(self._raws)

    def _at(self, i: int) -> CheckpointRecord:
        found = self._parsed[i]
        if found is None:
            found = self._parsed[i] = CheckpointRecord.model_validate_json(self._raws[i])
        return found

    @overload
    def __getitem__(self, index: int) -> CheckpointRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[CheckpointRecord]: ...

    def __getitem__(self, index: int | slice) -> CheckpointRecord | Sequence[CheckpointRecord]:
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._at(index)

    def __iter__(self) -> Iterator[CheckpointRecord]:
        for i in range(len(self)):
            yield self._at(i)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # a sequence, compared by its records

    def __repr__(self) -> str:
        return f"RecordsOnRead({len(self)} records)"
