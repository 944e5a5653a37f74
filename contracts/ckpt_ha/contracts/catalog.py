"""The event catalogue every service decodes with: every version, older ones upcast."""

from __future__ import annotations

from ckpt_ha.contracts.checkpoint import CHECKPOINT_EVENTS
from ckpt_ha.contracts.envelope import EventCatalog
from ckpt_ha.contracts.job import JOB_EVENTS, JOB_UPCASTERS
from ckpt_ha.contracts.resume import RESUME_EVENTS, UPCASTERS


def default_catalog() -> EventCatalog:
    catalog = EventCatalog()
    for model in (*CHECKPOINT_EVENTS, *JOB_EVENTS, *RESUME_EVENTS):
        catalog.register(model)
    for event_type, version, upcast in (*UPCASTERS, *JOB_UPCASTERS):
        catalog.upcaster(event_type, version)(upcast)
    return catalog


CATALOG = default_catalog()
