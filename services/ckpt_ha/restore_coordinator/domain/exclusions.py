"""R7 per location: what a load failure rules out is the place the bytes were read from, not
the checkpoint everywhere. A checkpoint of a replicating tier lives at its primary and at its
verified copies (same id, same checksums): when the primary fails to load, the next plan
restores the same checkpoint from a copy, and only when every copy has failed too (or none is
left) does it fall back to an older checkpoint.

The job's exclusions are one set of strings (``<p>:coord:excluded:<job>``): a plain checkpoint
id rules the whole checkpoint out (an operator's rollback, or a load failure recorded before
locations were: kept meaning what it meant), and `exclusion` (a JSON pair ``[id, uri]``) rules out
one location of it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Exclusions", "exclusion"]


def exclusion(checkpoint_id: str, uri: str | None = None) -> str:
    """The exclusion of ``checkpoint_id`` at ``uri`` (None: everywhere)."""
    if uri is None:
        return checkpoint_id
    return json.dumps([checkpoint_id, uri], separators=(",", ":"))


def _location(raw: str) -> tuple[str, str] | None:
    if not raw.startswith("["):
        return None
    try:
        pair = json.loads(raw)
    except ValueError:
        return None
    if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair):
        return pair[0], pair[1]
    return None


@dataclass(frozen=True)
class Exclusions:
    """The job's exclusions, read: whole checkpoints and single locations."""

    whole: frozenset[str] = frozenset()
    locations: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Checkpoint id → the locations of it that failed to load."""

    @classmethod
    def of(cls, members: Iterable[str]) -> Exclusions:
        whole: set[str] = set()
        at: dict[str, set[str]] = {}
        for raw in members:
            pair = _location(raw)
            if pair is None:
                whole.add(raw)
            else:
                at.setdefault(pair[0], set()).add(pair[1])
        return cls(frozenset(whole), {k: frozenset(v) for k, v in at.items()})

    def everywhere(self, checkpoint_id: str) -> bool:
        """The whole checkpoint is ruled out."""
        return checkpoint_id in self.whole

    def at(self, checkpoint_id: str) -> frozenset[str]:
        """The locations of ``checkpoint_id`` that failed to load."""
        return self.locations.get(checkpoint_id, frozenset())

    def describe(self) -> list[str]:
        """For humans, sorted: ``id`` or ``id at uri``."""
        one = [f"{c} at {u}" for c, uris in self.locations.items() for u in uris]
        return sorted([*self.whole, *one])
