"""ckpt-ha's identity and commit sidecars written beside a real checkpoint, the way a framework
integration writes them: the intent before the framework writes, the commit file last."""

from __future__ import annotations

from pathlib import Path

from ckpt_ha.contracts.checkpoint import CheckpointIdentity
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import sidecar
from ckpt_ha.storage import ObjectStore


def intent(job: str = "job-dcp", fmt: str = "torch_dcp", step: int | None = None) -> sidecar.Intent:
    identity = CheckpointIdentity(job_id=job, run_id="run-1", code_version="abc")
    return sidecar.Intent(identity=identity, format=fmt, step=step)


def commit_for(
    store: ObjectStore,
    prefix: str,
    step: int,
    algorithm: str = cs.DEFAULT_ALGORITHM,
    exact_resume: bool = True,
) -> sidecar.Commit:
    """A commit listing every file under ``prefix`` (but the sidecars) with size and checksum."""
    base = f"{prefix}/" if prefix else ""
    files = {}
    for info in store.list(base):
        path = info.key[len(base) :]
        if path not in sidecar.NAMES:
            digest, _ = cs.checksum(store, info.key, algorithm)
            files[path] = sidecar.FileEvidence(size=info.size, checksum=digest)
    return sidecar.Commit(step=step, files=files, exact_resume=exact_resume)


def folder_with_sidecars(
    folder: Path, step: int, *, commit: bool = True, algorithm: str = cs.DEFAULT_ALGORITHM
) -> None:
    """Sidecars around a checkpoint already in ``folder`` (the intent's time is not its first)."""
    from ckpt_ha.storage import FsStore

    store = FsStore(folder)
    sidecar.write_intent(store, "", intent(step=step))
    if commit:
        sidecar.write_commit(store, "", commit_for(store, "", step, algorithm))
