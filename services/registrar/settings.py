from __future__ import annotations

from services.shared.settings import ServiceSettings


class RegistrarSettings(ServiceSettings):
    """The registrar needs only the shared settings (bus, Redis, registry prefix)."""
