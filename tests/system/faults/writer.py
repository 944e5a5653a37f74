"""A job that writes checkpoints through a fault: the SDK's `save`, one after another, in a thread.

Each save writes a small native checkpoint into the stack's storage (through the writers' S3
link) and announces ``writing`` and ``committed`` on the stack's NATS, signed with the job's key,
exactly as a training job's `sdk.save` does. A save that fails (storage cut mid-write) is kept
too: its folder may hold a partial checkpoint the system must declare failed, never valid.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from ckpt_ha import sdk
from ckpt_ha.storage import ObjectStore
from tests.support.bus_tools import job_key
from tests.system.faults.stack import FaultStack


@dataclass(frozen=True)
class Save:
    """One save the writer attempted."""

    step: int
    folder: str
    """``<job>/step-<step>``, under the storage root."""
    uri: str
    checkpoint_id: str | None
    """Known when the save returned (None: it failed, see `error`)."""
    error: str | None = None
    damaged: bool = False
    """Its bytes were changed on storage after the save: it must end quarantined."""

    @property
    def committed(self) -> bool:
        return self.error is None


def state_for(step: int, size: int = 4096) -> dict[str, object]:
    weights = np.arange(size, dtype=np.float32) * np.float32(step % 1000 + 1)
    return {"model": {"w": weights}, "optimizer": {"step": step, "lr": 1e-3}, "rng": b"\x01" * 16}


class CheckpointWriter:
    """Saves checkpoints of ``job`` every ``every_s`` seconds until stopped."""

    def __init__(
        self,
        fs: FaultStack,
        job: str,
        *,
        every_s: float = 0.3,
        announce: bool = True,
        store: ObjectStore | None = None,
        first_step: int = 10,
        prefix: str = "ckpt",
    ) -> None:
        """``prefix``: the subject prefix announcements go to (the stack's, unless a fault
        holds them back on another)."""
        self.fs = fs
        self.job = job
        self.every_s = every_s
        self.store = store if store is not None else fs.writer_store()
        self.bus = (
            sdk.BusEndpoint(
                fs.nats_url, prefix=prefix, job_key=job_key(job), timeout_s=2.0, retry_after_s=1.0
            )
            if announce
            else None
        )
        self.saves: list[Save] = []
        self.next_step = first_step
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def save_one(self) -> Save:
        """One save, now, in the caller's thread."""
        with self._lock:
            step = self.next_step
            self.next_step += 10
        folder = sdk.folder_for(self.job, step)
        uri = self.store.uri(folder)
        try:
            saved = sdk.save(
                self.store, self.job, step, state_for(step), run_id="run-1", bus=self.bus
            )
        except Exception as exc:  # noqa: BLE001 - a failed save is a fact the fault counts
            done = Save(step, folder, uri, None, error=f"{type(exc).__name__}: {exc}")
        else:
            done = Save(step, folder, uri, saved.checkpoint_id)
        with self._lock:
            self.saves.append(done)
        return done

    def start(self) -> CheckpointWriter:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"writer-{self.job}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.save_one()
            self._stop.wait(max(0.0, self.every_s - (time.monotonic() - started)))

    def stop(self) -> list[Save]:
        """Stop after the save in progress; every save attempted so far."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
            assert not self._thread.is_alive(), "the writer did not stop"
            self._thread = None
        return self.committed_and_failed()

    def committed_and_failed(self) -> list[Save]:
        with self._lock:
            return list(self.saves)
