"""ckpt-ha wire contracts: versioned events, subjects, and the catalogue that decodes them."""

from ckpt_ha.contracts.catalog import CATALOG
from ckpt_ha.contracts.envelope import Envelope, EventCatalog, EventData, build, derive_event_id

__all__ = ["CATALOG", "Envelope", "EventCatalog", "EventData", "build", "derive_event_id"]
