"""Hostile bytes and out-of-bound values: the catalogue answers with a `ContractError`, always.

A consumer dead-letters a `ContractError` alone and handles the rest of its batch; any other
exception from `decode` would fail the batch. So every bad input here must be one.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from ckpt_ha.contracts import CATALOG, build
from ckpt_ha.contracts.bounds import MAX_METRICS, MAX_SAFE_INT
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat
from ckpt_ha.contracts.errors import ContractError, MalformedEvent
from ckpt_ha.contracts.job import JobProgressV1

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def _committed_doc(**data: Any) -> dict[str, Any]:
    event = build(
        CheckpointCommittedV1(
            job_id="j",
            checkpoint_id="c",
            uri="file:///x",
            run_id="r",
            step=7,
            format=CheckpointFormat.NATIVE,
        ),
        source="test",
        time=NOW,
        key="k",
    )
    doc: dict[str, Any] = json.loads(event.to_bytes())
    doc["data"].update(data)
    return doc


def _raw(**data: Any) -> bytes:
    return json.dumps(_committed_doc(**data)).encode()


def _with_step(text: str) -> bytes:
    """The committed event with ``"step":`` followed by ``text`` verbatim (not valid Python)."""
    return _raw(step=7).replace(b'"step": 7', b'"step": ' + text.encode())


def _deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels + b", "


def _deep_objects(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


def _identity(**fields: Any) -> dict[str, Any]:
    return {"job_id": "j", "run_id": "r", **fields}


def _libraries(n: int) -> dict[str, str]:
    return {str(i): "1" for i in range(n)}


def _envelope(**attributes: Any) -> bytes:
    return json.dumps({**_committed_doc(), **attributes}).encode()


HOSTILE: dict[str, bytes] = {
    "5000-digit step": _with_step("9" * 5000),
    "5000-digit negative step": _with_step("-" + "9" * 5000),
    "100-digit step": _with_step("9" * 100),
    "step 2**53": _with_step(str(MAX_SAFE_INT + 1)),
    "5000-digit float": _with_step("1" + "0" * 5000 + ".5"),
    "float overflowing to inf": _raw().replace(b'"metrics": {}', b'"metrics": {"a": 1e999}'),
    "NaN metric": _raw().replace(b'"metrics": {}', b'"metrics": {"a": NaN}'),
    "Infinity metric": _raw().replace(b'"metrics": {}', b'"metrics": {"a": -Infinity}'),
    "nested 300 deep": _with_step("[" * 300 + "]" * 300),
    "nested 100,000 deep": _with_step("[" * 100_000 + "]" * 100_000),
    "nested objects in data": _raw().replace(b'"metrics": {}', b'"metrics": ' + _deep_objects(250)),
    "deep tree in an unknown field": _raw().replace(b'"data": {', b'"data": {"x": ' + _deep(150)),
    "too many metrics": _raw(metrics={str(i): 1.0 for i in range(MAX_METRICS + 1)}),
    "metric name of 10,000 chars": _raw(metrics={"m" * 10_000: 1.0}),
    "run id of 100,000 chars": _raw(run_id="r" * 100_000),
    "shard count 2**64": _raw(shard_count=2**64),
    "negative total bytes": _raw(total_bytes=-1),
    "world size 2**40": _raw(identity=_identity(topology={"world_size": 2**40})),
    "attempt 0": _raw(identity=_identity(attempt=0)),
    "10,000 libraries": _raw(identity=_identity(environment={"libraries": _libraries(10_000)})),
    "lone surrogate": _raw().replace(b'"run_id": "r"', b'"run_id": "\\ud800"'),
    "invalid UTF-8 in a string": _raw().replace(b'"run_id": "r"', b'"run_id": "\xff\xfe"'),
    "BOM then JSON": b"\xef\xbb\xbf" + _raw(),
    "NUL bytes": b"\x00" * 1000,
    "huge exponent int-like": _with_step("1e400"),
    "tracestate of 100,000 chars": _envelope(tracestate="t" * 100_000),
    "an old version with a bad body": _raw().replace(b"committed.v1", b"committed.v0"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_bytes_are_a_contract_error(name: str) -> None:
    with pytest.raises(ContractError) as refused:
        CATALOG.decode(HOSTILE[name])
    assert refused.value.code in {"malformed", "unsupported_version", "unknown_type"}


def test_a_huge_number_says_why() -> None:
    with pytest.raises(MalformedEvent, match="not JSON: number out of range"):
        CATALOG.decode(HOSTILE["5000-digit step"])
    with pytest.raises(MalformedEvent, match=r"data\.step: Input should be less than or equal"):
        CATALOG.decode(HOSTILE["step 2**53"])


@pytest.mark.parametrize(
    "value", [0, 1, 10**12, MAX_SAFE_INT], ids=["zero", "one", "trillion", "max"]
)
def test_sane_steps_stay_valid(value: int) -> None:
    event = CATALOG.decode(_raw(step=value, total_bytes=value, shard_count=value))
    assert isinstance(event.data, CheckpointCommittedV1)
    assert event.data.step == value


def test_sane_events_of_before_the_bounds_stay_valid() -> None:
    event = CATALOG.decode(
        _raw(
            metrics={"val_loss": 0.25, "acc": 1e-300, "big": 1e300},
            identity={
                "job_id": "j",
                "run_id": "r",
                "attempt": 12,
                "topology": {"world_size": 16384, "tensor_parallel": 8, "data_parallel": 2048},
                "environment": {"libraries": {f"lib{i}": "1.0" for i in range(300)}},
            },
        )
    )
    assert isinstance(event.data, CheckpointCommittedV1)
    assert event.data.metrics["big"] == 1e300


def test_non_finite_metrics_cannot_even_be_built() -> None:
    """What JSON cannot carry never leaves a producer: the model refuses it at construction."""
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValidationError, match="finite number"):
            JobProgressV1(job_id="j", run_id="r", step=1, metrics={"loss": bad})
