"""Provision and check the streams (``ckpt-ha streams``), under the operator's credentials."""

from __future__ import annotations

import nats

from ckpt_ha.bus import streams
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.ops.errors import OperationFailed


class StreamsRefused(OperationFailed):
    """A stream is not as required (or could not be changed); the text says which and why."""


async def provision_streams(cfg: BusConfig) -> list[str]:
    """Create or update both streams; one line per stream saying what was done."""
    nc = await nats.connect(
        cfg.url, **cfg.connect_options(), connect_timeout=5, max_reconnect_attempts=1
    )
    try:
        return await streams.provision(nc.jetstream(), cfg)
    except nats.js.errors.APIError as exc:
        raise StreamsRefused(f"NATS refused to provision the streams: {exc}") from None
    finally:
        await nc.close()


async def check_streams(cfg: BusConfig) -> None:
    nc = await nats.connect(
        cfg.url, **cfg.connect_options(), connect_timeout=5, max_reconnect_attempts=1
    )
    try:
        await streams.check(nc.jetstream(), cfg)
    except streams.StreamMisconfigured as exc:
        raise StreamsRefused(str(exc)) from None
    finally:
        await nc.close()
