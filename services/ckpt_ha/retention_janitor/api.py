"""The retention-janitor's published face: all that other code (the operator's ``ckpt-ha
retention plan`` and ``ckpt-ha reconcile``) may import of it. Everything else in the package is
the service's own and may change with it.

* `plan_round` and what it reads and returns: the decisions a retention round would take now,
  computed by the janitor's own rules (`Decision`, `Action`; the ports it reads through).
* `locations` and `unknown_objects`: which storage objects a registry record accounts for, and
  which listed objects none does (the reconcile of unknown objects).
"""

from __future__ import annotations

from ckpt_ha.retention_janitor.adapters import locations
from ckpt_ha.retention_janitor.domain import Action, Decision, unknown_objects
from ckpt_ha.retention_janitor.handlers import plan_round
from ckpt_ha.retention_janitor.ports import PinReads, ResumeReads, RetentionRegistry

__all__ = [
    "Action",
    "Decision",
    "PinReads",
    "ResumeReads",
    "RetentionRegistry",
    "locations",
    "plan_round",
    "unknown_objects",
]
