"""`--storage` of `ckpt-ha up` and `ckpt-ha drill`: what parses, and what is a usage error."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_ha.cli.arguments import UsageError, needs_s3_endpoint
from ckpt_ha.cli.parser import build_parser


def storage(*args: str) -> str | None:
    parsed = build_parser().parse_args(["drill", "--scenario", "node-exit", *args])
    value: str | None = parsed.storage
    return value


def test_s3_file_and_local_roots_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert storage() is None
    assert storage("--storage", "s3://bucket/prefix/") == "s3://bucket/prefix"
    assert storage("--storage", "file:///srv/ckpt") == "file:///srv/ckpt"
    monkeypatch.chdir(tmp_path)
    assert storage("--storage", "roots/a") == str(tmp_path / "roots" / "a")
    up = build_parser().parse_args(["up", "--storage", "s3://bucket/p"])
    assert up.storage == "s3://bucket/p"


@pytest.mark.parametrize(
    "value", ["ftp://host/x", "s3://", "s3:///prefix", "file://host/x", "gs://bucket/p", " "]
)
def test_anything_else_is_a_usage_error(value: str) -> None:
    with pytest.raises(UsageError, match="--storage"):
        storage("--storage", value)


def test_s3_needs_an_endpoint_a_local_root_does_not() -> None:
    needs_s3_endpoint(None, {})
    needs_s3_endpoint("/srv/ckpt", {})
    needs_s3_endpoint("s3://bucket/p", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    with pytest.raises(UsageError, match="needs AWS_ENDPOINT_URL"):
        needs_s3_endpoint("s3://bucket/p", {})
