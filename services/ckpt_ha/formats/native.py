"""The native ckpt-ha layout: shards first, then ``ckpt-ha.manifest.json`` last and atomically.

The manifest is the commit evidence: it lists every shard with size and checksum, plus the
identity block (R4). It is written create-only (`put_if_absent`: rename on POSIX,
``If-None-Match: *`` on S3), so a manifest either exists whole or not at all, and a checkpoint
without one is never complete.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ckpt_ha.contracts.bounds import Count
from ckpt_ha.contracts.checkpoint import CheckpointFormat, CheckpointIdentity
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import jsondoc, limits, listed
from ckpt_ha.formats.paths import inside, join
from ckpt_ha.formats.report import Report, Verdict
from ckpt_ha.storage import ObjectNotFound, ObjectStore

MANIFEST = "ckpt-ha.manifest.json"
MANIFEST_FORMAT = "ckpt-ha/manifest/v1"
MAX_MANIFEST_BYTES = limits.MAX_MANIFEST_BYTES


class Shard(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(min_length=1, max_length=1024)
    size: Count
    checksum: str = Field(min_length=3, max_length=200)


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = Field(default=MANIFEST_FORMAT, max_length=200)
    step: Count
    created_at: datetime
    identity: CheckpointIdentity | None = None
    exact_resume: bool = True
    """False when the shards hold weights only (no optimizer state)."""
    shards: tuple[Shard, ...]


def write(
    store: ObjectStore,
    prefix: str,
    shards: Mapping[str, bytes],
    *,
    step: int,
    created_at: datetime,
    identity: CheckpointIdentity | None = None,
    exact_resume: bool = True,
    algorithm: str = cs.DEFAULT_ALGORITHM,
) -> Manifest:
    """Write shards (each durable before the next step), then the manifest, create-only."""
    entries = []
    for name, data in shards.items():
        path = inside(name)
        if path is None:
            raise ValueError(f"shard name {name!r} must be a relative path inside the checkpoint")
        key = join(prefix, path)
        store.put(key, data)
        entries.append(Shard(path=path, size=len(data), checksum=cs.of_bytes(data, algorithm)))
    manifest = Manifest(
        step=step,
        created_at=created_at,
        identity=identity,
        exact_resume=exact_resume,
        shards=tuple(entries),
    )
    store.put_if_absent(join(prefix, MANIFEST), manifest.model_dump_json(indent=2).encode())
    return manifest


def verify(store: ObjectStore, prefix: str, report: Report | None = None) -> Report:
    """Check the manifest, then every shard's presence, size and checksum (one read each)."""
    report = report or Report(format=CheckpointFormat.NATIVE)
    key = join(prefix, MANIFEST)
    try:
        info = store.stat(key)
    except ObjectNotFound:
        report.fail(Verdict.INCOMPLETE, f"{MANIFEST} is missing: the write never committed")
        return report
    if info.size > MAX_MANIFEST_BYTES:
        report.fail(
            Verdict.CORRUPT, f"{MANIFEST} is {info.size} bytes (limit {MAX_MANIFEST_BYTES})"
        )
        return report
    try:
        manifest = Manifest.model_validate(jsondoc.parse(store.read_bytes(key)))
    except jsondoc.JsonInvalid as exc:
        report.fail(Verdict.CORRUPT, f"{MANIFEST} is not valid JSON: {exc}")
        return report
    except ValidationError as exc:
        report.fail(Verdict.CORRUPT, f"{MANIFEST} does not match the schema: {exc.errors()[0]}")
        return report
    if manifest.format != MANIFEST_FORMAT:
        report.fail(Verdict.UNKNOWN, f"{MANIFEST} has format {manifest.format!r}")
        return report
    report.step = manifest.step
    report.exact_resume = manifest.exact_resume
    report.checks.append("manifest")
    files = [listed.Listed(shard.path, shard.size, shard.checksum) for shard in manifest.shards]
    for check in listed.check_all(store, prefix, files, "manifest"):
        check.apply(report)
    if report.ok:
        report.checks += ["sizes", "checksums"]
    return report
