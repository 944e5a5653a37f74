from __future__ import annotations

from ckpt_ha.runtime.settings import ServiceSettings


class RegistrarSettings(ServiceSettings):
    """The registrar needs only the shared settings (bus, Redis, registry prefix, and the
    storage root: a location's place in it decides which job may register it)."""
