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
    whole_state: bool | None = None
    """True when one process of a multi-rank job wrote the whole job's state (DDP replicas:
    rank 0 holds everything). Written only then (`dump`), so a manifest of a single process
    reads the same to a checker that predates the field."""

    def dump(self) -> bytes:
        """The manifest's bytes: ``whole_state`` only when it says something."""
        exclude = {"whole_state"} if self.whole_state is None else None
        return self.model_dump_json(indent=2, exclude=exclude).encode()


def missing_ranks(manifest: Manifest) -> list[int]:
    """The ranks whose state the manifest cannot hold: a native manifest is one process's
    state, so when its identity declares a job of N > 1 ranks and it does not say it holds the
    whole job's (``whole_state``), ranks 1..N-1 have no shard in it (one rank's part saved as
    if it were the whole checkpoint: R1's partial shard set)."""
    topology = manifest.identity.topology if manifest.identity is not None else None
    if topology is None or topology.world_size <= 1 or manifest.whole_state:
        return []
    return list(range(1, topology.world_size))


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
    store.put_if_absent(join(prefix, MANIFEST), manifest.dump())
    return manifest


def verify(
    store: ObjectStore, prefix: str, report: Report | None = None, *, ranks: bool = True
) -> Report:
    """Check the manifest, then every shard's presence, size and checksum (one read each).

    With ``ranks`` (the default), a manifest that cannot hold every rank its identity declares
    (`missing_ranks`) is incomplete. A scrub passes False: it checks that the bytes did not
    change since verification, and a checkpoint verified before this check existed keeps its
    verdict (DDP jobs saved rank 0's whole state without saying so)."""
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
    missing = missing_ranks(manifest) if ranks else []
    if missing:
        declared = manifest.identity.topology.world_size  # type: ignore[union-attr]
        report.fail(
            Verdict.INCOMPLETE,
            f"the identity declares {declared} ranks but {MANIFEST} holds one process's state and "
            f"does not say it is the whole job's (whole_state): no shard of rank(s) "
            f"{', '.join(map(str, missing))}",
        )
    files = [listed.Listed(shard.path, shard.size, shard.checksum) for shard in manifest.shards]
    for check in listed.check_all(store, prefix, files, "manifest"):
        check.apply(report)
    if report.ok:
        report.checks += ["sizes", "checksums"]
    return report
