"""The five services by name: the plain list the local stack starts and `ckpt-ha serve` accepts.

Names only, so that anything may read it without importing a service; which composition root
each name runs is `ckpt_ha.cli.serve`.
"""

from __future__ import annotations

SERVICE_NAMES = (
    "writer-watcher",
    "integrity-checker",
    "registrar",
    "restore-coordinator",
    "retention-janitor",
)
