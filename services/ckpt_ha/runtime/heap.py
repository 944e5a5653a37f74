"""The garbage collector of a long-running service process, settled once start-up is done.

A service imports faststream, pydantic, OpenTelemetry, redis and its own schemas before it
consumes anything: 78,000 to 80,000 container objects once the registrar or the checker is
built, nearly all living as long as the process. CPython's cyclic collector walks every one of
them on each full collection (47 to 61 ms for those two here), and its default young
threshold (700 allocations) starts a young collection every few events of a consumer that builds
models for each event. Measured on the registrar (`bench/bench_consume.py`, 20,000 events a
round): 0.37 to 0.58 s of collection per round of about 2.5 s with the defaults, 0.03 to 0.06 s
settled.

`settle` collects what start-up left behind, then freezes the survivors (``gc.freeze``: the
collector no longer walks them; reference counting still frees them when their last reference
goes) and raises the young threshold, so a consumer's per-event garbage is collected in larger,
rarer passes. Objects created later are collected as before; only cycles among the frozen
start-up objects are never collected (what was already garbage is collected just before).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Allocations (net of frees) between two young collections; CPython's default is 700."""


def settle() -> None:
    """Collect, freeze what survived start-up, and raise the young generation's threshold.
    Call it once the process has imported and built everything it serves with (idempotent:
    calling it again freezes what was created since)."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), middle, old)
