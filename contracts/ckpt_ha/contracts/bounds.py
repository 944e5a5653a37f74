"""The bounds of every value on the wire, as shared annotated types: one definition each.

An event is read by services in several languages and stores (Python, the Redis scripts'
JSON decoder, dashboards), so a value every one of them can hold exactly is part of the
contract, not a detail of one reader. Every number, string and mapping in an event payload is
declared with one of these types; a payload outside them fails validation and is dead-lettered
(`MalformedEvent`) alone, before any handler sees it.

=================  ===================================  ============================================
type               bounds                               used for
=================  ===================================  ============================================
`Count`            0 .. 2**53-1 (`MAX_SAFE_INT`)        steps, sizes, byte counts, offsets, counters
`Attempt`          1 .. `MAX_ATTEMPT` (1,000,000)       a run's attempt number
`WorldSize`        1 .. `MAX_WORLD_SIZE` (2**20)        world size and each parallel degree
`Rank`             0 .. `MAX_WORLD_SIZE` - 1            one process of a job
`ExitCode`         -2**31 .. 2**32-1                    a process exit status (negative: a signal)
`Signal`           0 .. 255                             a signal number
`FiniteFloat`      finite (no NaN, no +-Infinity)       metrics, tolerances, compared values
`Seconds`          finite, >= 0                         durations
`Name`             <= 200 characters (`MAX_NAME`)       ids, projects, tiers, actors, pin holders
`Label`            <= 1,024 characters (`MAX_LABEL`)    run ids, versions, images, hashes, rule
                                                        fields, metric names' values, fingerprints
`Text`             <= 16,384 characters (`MAX_TEXT`)    reasons, details, findings, checks, command
                                                        arguments
`Uri`              1 .. 2,048 characters                storage locations
`Metrics`          <= 256 entries (`MAX_METRICS`),      a step's or checkpoint's metrics
                   `Name` -> `FiniteFloat`
`Libraries`        <= 1,024 entries (`MAX_LIBRARIES`),  a runtime's library versions
                   `Name` -> `Label`
=================  ===================================  ============================================

Why 2**53-1: it is the largest integer a JSON number holds exactly in a double (JavaScript,
the Lua ``cjson`` in the registry's Redis scripts, most dashboards); a larger step or size
would be rounded or rejected by some reader downstream. Lists are bounded by the event's size
(`envelope.MAX_EVENT_BYTES`), and JSON nesting by the parser (200 levels, `envelope`).

The bounds were added to v1 events without a new version: every value a sane producer ever
sent (steps, sizes and counts far below 2**53, finite floats, short names) stays valid, and
what they now refuse (NaN, which JSON cannot carry; integers no reader downstream holds; a
megabyte of text in a name) was never decodable end to end.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

MAX_SAFE_INT = 2**53 - 1
MAX_ATTEMPT = 1_000_000
MAX_WORLD_SIZE = 2**20
MAX_NAME = 200
MAX_LABEL = 1024
MAX_TEXT = 16 * 1024
MAX_URI = 2048
MAX_METRICS = 256
MAX_LIBRARIES = 1024

Count = Annotated[int, Field(ge=0, le=MAX_SAFE_INT)]
Attempt = Annotated[int, Field(ge=1, le=MAX_ATTEMPT)]
WorldSize = Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)]
Rank = Annotated[int, Field(ge=0, le=MAX_WORLD_SIZE - 1)]
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**32 - 1)]
Signal = Annotated[int, Field(ge=0, le=255)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Name = Annotated[str, Field(max_length=MAX_NAME)]
Label = Annotated[str, Field(max_length=MAX_LABEL)]
Text = Annotated[str, Field(max_length=MAX_TEXT)]
Uri = Annotated[str, Field(min_length=1, max_length=MAX_URI)]
Metrics = Annotated[dict[Name, FiniteFloat], Field(max_length=MAX_METRICS)]
Libraries = Annotated[dict[Name, Label], Field(max_length=MAX_LIBRARIES)]
