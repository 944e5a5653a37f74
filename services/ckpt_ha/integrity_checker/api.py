"""The integrity-checker's published face: all that other code (the operator's ``ckpt-ha
reconcile``) may import of it. Everything else in the package is the service's own.

* `IntegrityCheckerSettings`: its settings, of which others read ``replica_roots`` (where each
  replicating tier's copies go: the roots ``ckpt-ha reconcile`` also looks at for leftovers).
"""

from __future__ import annotations

from ckpt_ha.integrity_checker.settings import IntegrityCheckerSettings

__all__ = ["IntegrityCheckerSettings"]
