"""The retention-janitor's published face: all that other code (the operator's ``ckpt-ha
retention plan`` and ``ckpt-ha reconcile``, a registry rebuild) may import of it. Everything else
in the package is the service's own and may change with it.

* `plan_round` and what it reads and returns: the decisions a retention round would take now,
  computed by the janitor's own rules (`Decision`, `Action`; the ports it reads through).
* `RedisResumes`: the janitor's own view of resumes in progress (its key space), which protects
  the checkpoints a plan names, and `ResumeViewReplay`, how a registry rebuild replays it;
  `RetentionJanitorSettings` says how long it keeps a plan.
* `StoreArchive` (`TombstoneArchive`, `open_archive`): the cold archive of tombstones moved
  out of the registry after ``tombstone_hot_days``, which ``retention audit`` reads too.
* `locations` and `unknown_objects`: which storage objects a registry record accounts for, and
  which listed objects none does (the reconcile of unknown objects).
"""

from __future__ import annotations

from ckpt_ha.retention_janitor.adapters import locations
from ckpt_ha.retention_janitor.archive import StoreArchive, open_archive
from ckpt_ha.retention_janitor.domain import Action, Decision, unknown_objects
from ckpt_ha.retention_janitor.handlers import plan_round
from ckpt_ha.retention_janitor.ports import ResumeView, RetentionRegistry, TombstoneArchive
from ckpt_ha.retention_janitor.replay import ResumeViewReplay
from ckpt_ha.retention_janitor.settings import RetentionJanitorSettings
from ckpt_ha.retention_janitor.store import RedisResumes

__all__ = [
    "Action",
    "Decision",
    "RedisResumes",
    "ResumeView",
    "ResumeViewReplay",
    "RetentionJanitorSettings",
    "RetentionRegistry",
    "StoreArchive",
    "TombstoneArchive",
    "locations",
    "open_archive",
    "plan_round",
    "unknown_objects",
]
