"""R10: the resumed attempt's progress against the pre-failure trajectory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ckpt_ha.contracts.job import (
    JobPolicy,
    Tolerance,
)
from ckpt_ha.contracts.resume import Comparison
from ckpt_ha.restore_coordinator.records import Point


def within(tolerance: Tolerance, expected: float, observed: float) -> tuple[bool, float]:
    """``|observed - expected| <= abs + rel * |expected|``; also returns the allowed distance."""
    allowed = tolerance.abs + tolerance.rel * abs(expected)
    return abs(observed - expected) <= allowed, allowed


def data_position_label(world: tuple[int, int] | None) -> str:
    """How the data position comparison is named: at another world size it is the samples
    seen (a global position: the same at any world size when the job reports it so)."""
    if world is None:
        return "data_position"
    old, new = world
    return f"data_position (samples seen) at world size {new}, the trajectory's at {old}"


def compare_point(
    expected: Point, observed: Point, policy: JobPolicy, world: tuple[int, int] | None = None
) -> list[Comparison]:
    """Data position and RNG fingerprint exactly (when the trajectory has them), declared
    metrics within their tolerance (when the trajectory has them). ``world``: the trajectory's
    and the resumed attempt's world sizes, when they differ."""
    at = f"step {observed.step}"
    out: list[Comparison] = []
    if expected.data_position is not None:
        out.append(
            Comparison(
                name=f"{at}: {data_position_label(world)}",
                expected=float(expected.data_position),
                observed=None if observed.data_position is None else float(observed.data_position),
                ok=observed.data_position == expected.data_position,
            )
        )
    if expected.rng_fingerprint is not None:
        out.append(
            Comparison(
                name=f"{at}: rng_fingerprint",
                expected=expected.rng_fingerprint,
                observed=observed.rng_fingerprint,
                ok=observed.rng_fingerprint == expected.rng_fingerprint,
            )
        )
    for tol in policy.tolerances:
        want = expected.metrics.get(tol.metric)
        if want is None:
            continue
        got = observed.metrics.get(tol.metric)
        ok, allowed = within(tol, want, got) if got is not None else (False, 0.0)
        if got is None:
            allowed = tol.abs + tol.rel * abs(want)
        out.append(
            Comparison(
                name=f"{at}: {tol.metric}",
                expected=want,
                observed=got,
                tolerance=allowed,
                ok=ok,
            )
        )
    return out


@dataclass(frozen=True)
class Continuity:
    verdict: str
    """``pending`` (need more reports), ``verified`` or ``diverged``."""
    comparisons: tuple[Comparison, ...] = ()
    reason: str = ""
    step: int = 0


PENDING, VERIFIED, DIVERGED = "pending", "verified", "diverged"


def _carried(world: tuple[int, int] | None, carried: bool) -> list[Comparison]:
    """The verdict's evidence on the sampler's order at another world size (none: the same)."""
    if world is None:
        return []
    old, new = world
    return [
        Comparison(
            name=f"world size {old}→{new}: the sampler's order carried over",
            expected="yes",
            observed="yes" if carried else "no",
            ok=carried,
        )
    ]


def _order(world: tuple[int, int] | None, carried: bool) -> str:
    """The continuity verdict's word on the sampler's order at another world size."""
    if world is None:
        return ""
    old, new = world
    if carried:
        return (
            f"; world size {old}→{new}: the sampler's order carried over (the resumed steps "
            "see the same data, in the same order, as before the failure)"
        )
    return (
        f"; world size {old}→{new}: the sampler's order may not have carried over (a per-rank "
        "sampler orders differently at another world size)"
    )


def continuity(
    *,
    restored_step: int,
    trajectory: Mapping[int, Point],
    observed: Sequence[Point],
    policy: JobPolicy,
    world: tuple[int, int] | None = None,
) -> Continuity:
    """R10 over the resumed attempt's first reports (in arrival order): the first must be at the
    restored step or the one after; each later one at a step the pre-failure trajectory knows is
    compared. The verdict comes after ``continuity_steps`` compared reports, or as soon as a
    comparison fails, or when the run passes the end of the old trajectory.

    ``world``: (the trajectory's, the resumed attempt's) world sizes when the restore changed
    it. The verdict then states the data position at the new world size and whether the
    sampler's order carried over: the same data positions, RNG and metrics at the resumed
    steps say it did; a difference says it did not (the reason says so)."""
    if not observed:
        return Continuity(PENDING)
    first = observed[0]
    start = Comparison(
        name="first step",
        expected=float(restored_step + 1),
        observed=float(first.step),
        ok=first.step in (restored_step, restored_step + 1),
    )
    if not start.ok:
        return Continuity(
            DIVERGED,
            (start,),
            f"first progress at step {first.step}, expected {restored_step} or {restored_step + 1}",
            first.step,
        )
    comparisons: list[Comparison] = [start]
    compared = 0
    last_known = max(trajectory, default=-1)
    for point in observed:
        expected = trajectory.get(point.step)
        if expected is None:
            if point.step > last_known:
                reason = "" if compared else "no pre-failure progress at the resumed steps"
                if compared:
                    comparisons += _carried(world, True)
                    reason = _order(world, True).lstrip("; ")
                return Continuity(VERIFIED, tuple(comparisons), reason, point.step)
            continue
        found = compare_point(expected, point, policy, world)
        comparisons.extend(found)
        compared += 1
        bad = [c for c in found if not c.ok]
        if bad:
            why = "; ".join(f"{c.name} {c.observed} vs {c.expected}" for c in bad)
            comparisons += _carried(world, False)
            return Continuity(DIVERGED, tuple(comparisons), why + _order(world, False), point.step)
        if compared >= policy.continuity_steps:
            comparisons += _carried(world, True)
            return Continuity(VERIFIED, tuple(comparisons), _order(world, True).lstrip("; "),
                              point.step)  # fmt: skip
    return Continuity(PENDING, tuple(comparisons), "", observed[-1].step)
