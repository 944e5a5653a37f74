"""The writer-watcher's published face: all that other code may import of it. Everything else
in the package is the service's own and may change with it.

* Its key space: `state_key` (the watch state of one storage root) and `state_keys` (the
  pattern of every root's), formatted by the one module that owns those keys.
"""

from __future__ import annotations

from ckpt_ha.writer_watcher.adapters import state_key, state_keys

__all__ = ["state_key", "state_keys"]
