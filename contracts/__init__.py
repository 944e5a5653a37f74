"""ckpt-ha wire contracts: versioned events, subjects, and the catalogue that decodes them."""

from contracts.catalog import CATALOG
from contracts.envelope import Envelope, EventCatalog, EventData, build, derive_event_id

__all__ = ["CATALOG", "Envelope", "EventCatalog", "EventData", "build", "derive_event_id"]
