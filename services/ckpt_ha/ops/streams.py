"""The streams under the operator's credentials: provision and check them (``ckpt-ha
streams``; provisioning also retires the durables it made obsolete), and make sure a rebuild
replays a complete history."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats
from nats.js.client import JetStreamContext

from ckpt_ha.bus import obsolete, permissions, streams
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.core.clock import Clock, utc_now
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


async def provision_streams(
    cfg: BusConfig, *, obsolete_grace_s: float, clock: Clock = utc_now
) -> list[str]:
    """Create or update the streams, then list ckpt-ha's durables they no longer feed and
    remove those idle for ``obsolete_grace_s`` (`ckpt_ha.bus.obsolete`); one line per stream
    and per obsolete durable saying what was done."""
    async with _jetstream(cfg) as js:
        done = await streams.provision(js, cfg)
        done += await obsolete.retire(
            js, cfg, permissions.users(), grace_s=obsolete_grace_s, now=clock()
        )
        return done


async def check_streams(cfg: BusConfig) -> None:
    async with _jetstream(cfg) as js:
        await streams.check(js, cfg)


async def require_complete_stream(cfg: BusConfig) -> str:
    """`StreamIncomplete` when the event stream lost its first events; else its identity
    (`ckpt_ha.bus.streams.identity`)."""
    async with _jetstream(cfg) as js:
        await streams.require_complete(js, cfg)
        return await streams.identity(js, cfg)
