"""The streams under the operator's credentials: provision and check them (``ckpt-ha
streams``), and make sure a rebuild replays a complete history."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats
from nats.js.client import JetStreamContext

from ckpt_ha.bus import streams
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.ops.errors import OperationFailed, StreamIncomplete


class StreamsRefused(OperationFailed):
    """A stream is not as required (or could not be changed); the text says which and why."""


@asynccontextmanager
async def _jetstream(cfg: BusConfig) -> AsyncIterator[JetStreamContext]:
    """JetStream on a connection of its own for one operation; the streams' own errors become
    the one-line `OperationFailed` the CLI prints."""
    nc = await nats.connect(
        cfg.servers, **cfg.connect_options(), **cfg.connection_policy(lasting=False)
    )
    try:
        yield nc.jetstream()
    except streams.StreamTruncated as exc:
        raise StreamIncomplete(str(exc)) from None
    except streams.StreamMisconfigured as exc:
        raise StreamsRefused(str(exc)) from None
    except nats.js.errors.APIError as exc:
        raise StreamsRefused(f"NATS refused: {exc}") from None
    finally:
        await nc.close()


async def provision_streams(cfg: BusConfig) -> list[str]:
    """Create or update both streams; one line per stream saying what was done."""
    async with _jetstream(cfg) as js:
        return await streams.provision(js, cfg)


async def check_streams(cfg: BusConfig) -> None:
    async with _jetstream(cfg) as js:
        await streams.check(js, cfg)


async def require_complete_stream(cfg: BusConfig) -> None:
    """`StreamIncomplete` when the event stream lost its first events."""
    async with _jetstream(cfg) as js:
        await streams.require_complete(js, cfg)
