"""What every command composes from: the settings (pointed at the local stack unless told
otherwise), the registry and a publisher for one command, who is acting, and the one place that
turns an unreachable dependency into a one-line failure.

Every command module is imported to build the parser: this one, like them, imports the settings,
faststream, redis and boto3 only inside the function that needs them, so that the read-only
commands an operator runs at 3 a.m. start fast and `verify` runs on the light install."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ckpt_ha.cli import contexts
from ckpt_ha.cli.errors import CommandError, Handler, Unreachable

__all__ = ["CommandError", "Handler", "Unreachable"]

if TYPE_CHECKING:
    from ckpt_ha.bus.broker import Bus
    from ckpt_ha.contracts import Envelope, EventData
    from ckpt_ha.registry.pins import RedisPins
    from ckpt_ha.registry.redis_registry import Registry
    from ckpt_ha.restore_coordinator.api import RestoreReader
    from ckpt_ha.runtime.settings import ServiceSettings

T = TypeVar("T")
S = TypeVar("S", bound="ServiceSettings")


def settings(env: Mapping[str, str], home: Path, principal: str = "operator") -> ServiceSettings:
    """`settings_of` the shared settings."""
    from ckpt_ha.runtime.settings import ServiceSettings

    return settings_of(ServiceSettings, env, home, principal)


def settings_of(kind: type[S], env: Mapping[str, str], home: Path, principal: str) -> S:
    """Settings of ``kind`` for one command, by the rules of `ckpt_ha.cli.contexts.resolve`:
    a chosen context's endpoints and credentials; else NATS_URL and REDIS_URL with the
    credentials of the environment; else the local stack's, logged in to its NATS and Redis as
    ``principal`` (the CLI is ``operator``, `ckpt-ha run` the ``runner``) with the credentials
    under $CKPT_HA_HOME/secrets/. Never some of one and some of another."""
    from ckpt_ha.credentials import read_secret_file
    from ckpt_ha.runtime import local_stack

    state = local_stack.StackState.load(home)
    uses = ("NATS_URL",) if principal == local_stack.RUNNER else ("NATS_URL", "REDIS_URL")
    where = contexts.resolve(env, home, state is not None, uses)
    overrides: dict[str, Any] = {}
    if where.context is not None:
        overrides |= where.context.settings
        for field, file in where.context.secret_files.items():
            overrides[field] = read_secret_file(file, f"context {where.context.name}: {field}")
    elif where.kind == "local" and state is not None:
        overrides |= local_stack.login_settings(state, principal)
        overrides["nats_url"] = state.nats_url
        overrides["redis_url"] = state.redis_url
        if not env.get("CKPT_HA_STORAGE_ROOT"):
            overrides["storage_root"] = state.storage_root
        if "tombstone_archive" in kind.model_fields and not env.get("CKPT_HA_TOMBSTONE_ARCHIVE"):
            # Where the local stack's janitor archives tombstones (`ckpt_ha.lab.devstack.stack`).
            overrides["tombstone_archive"] = str(home / "tombstones")
    return kind(**overrides)


def where(env: Mapping[str, str], home: Path) -> contexts.Resolved:
    """Where a command's endpoints come from (`status` prints it)."""
    from ckpt_ha.runtime import local_stack

    return contexts.resolve(env, home, local_stack.StackState.load(home) is not None)


def run(settings: ServiceSettings, coro: Callable[[], Awaitable[T]]) -> T:
    """Run one command's I/O; an unreachable Redis or NATS is one line (exit 3)."""
    import nats.errors
    import redis.exceptions

    from ckpt_ha.credentials import redact_url
    from ckpt_ha.registry.port import RegistryUnavailable

    try:
        return asyncio.run(coro())  # type: ignore[arg-type]
    except (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        RegistryUnavailable,
    ) as exc:
        from ckpt_ha.registry.client import describe

        why = describe(exc) if isinstance(exc, redis.exceptions.RedisError) else str(exc)
        raise Unreachable(
            f"cannot reach Redis at {redact_url(settings.redis_url)}: {why}"
        ) from None
    except redis.exceptions.NoPermissionError as exc:
        raise CommandError(
            f"Redis at {redact_url(settings.redis_url)} refused {settings.redis_user}: {exc}"
        ) from None
    except (nats.errors.NoServersError, nats.errors.TimeoutError, OSError) as exc:
        raise Unreachable(
            f"cannot reach NATS at {redact_url(settings.nats_url)}: {exc!r}"
        ) from None


@asynccontextmanager
async def registry(settings: ServiceSettings) -> AsyncIterator[Registry]:
    from ckpt_ha.registry.redis_registry import Registry

    reg = Registry.from_url(
        settings.redis(), settings.registry_prefix, applied_window_s=settings.applied_window_s
    )
    try:
        yield reg
    finally:
        await reg.close()


@asynccontextmanager
async def restore_owners(
    settings: ServiceSettings,
) -> AsyncIterator[tuple[RedisPins, RestoreReader]]:
    """The owners of the pins and of the restore state (plans, verdicts, failures) for one
    command, on one connection."""
    from ckpt_ha.registry.client import connect
    from ckpt_ha.registry.pins import RedisPins
    from ckpt_ha.restore_coordinator.api import RestoreReader

    client = connect(settings.redis())
    pins = RedisPins(client, settings.registry_prefix)
    try:
        yield pins, RestoreReader(client, settings.registry_prefix)
    finally:
        await client.aclose()


class LazyPublisher:
    """The command's `Publisher`: connects to NATS on the first publish only, so an action the
    registry refuses never needs the broker."""

    def __init__(self, settings: ServiceSettings, service: str) -> None:
        self._settings = settings
        self._service = service
        self._bus: Bus | None = None

    async def _started(self) -> Bus:
        if self._bus is None:
            from ckpt_ha.bus.broker import Bus

            bus = Bus(self._settings.bus(), self._service)
            await bus.broker.start()
            self._bus = bus
        return self._bus

    async def publish(self, event: Envelope[EventData]) -> Envelope[EventData]:
        return await (await self._started()).publish(event)

    async def publish_many(self, events: Sequence[Envelope[EventData]]) -> list[Exception | None]:
        return await (await self._started()).publish_many(events)

    async def publish_caused_by(
        self,
        cause: Envelope[EventData],
        datas: Sequence[EventData],
        *,
        source: str,
        time: datetime,
        key: str | None = None,
    ) -> None:
        bus = await self._started()
        await bus.publish_caused_by(cause, datas, source=source, time=time, key=key)

    async def close(self) -> None:
        if self._bus is not None:
            bus, self._bus = self._bus, None
            await bus.broker.stop()


@asynccontextmanager
async def publisher(
    settings: ServiceSettings, service: str = "cli"
) -> AsyncIterator[LazyPublisher]:
    pub = LazyPublisher(settings, service)
    try:
        yield pub
    finally:
        await pub.close()


def actor(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """Who acts: ``--actor``, else $CKPT_HA_ACTOR, else the login name; recorded with the act."""
    import getpass

    who = args.actor or env.get("CKPT_HA_ACTOR") or env.get("USER") or env.get("LOGNAME")
    if not who:
        try:
            who = getpass.getuser()
        except (OSError, KeyError):
            who = None
    if not who:
        raise CommandError("who is acting? pass --actor NAME (or set CKPT_HA_ACTOR)")
    return str(who)
