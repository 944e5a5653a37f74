from __future__ import annotations

from services.shared.settings import ServiceSettings


class WriterWatcherSettings(ServiceSettings):
    """Settings of the writer-watcher process (its own options arrive with its logic)."""
