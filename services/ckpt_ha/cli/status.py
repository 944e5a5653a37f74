"""`ckpt-ha status`: is the platform up? Against whatever the command's context names (a
deployment through `--context`, NATS_URL and REDIS_URL, or the local stack): the context, NATS,
Redis and the storage reachable or not, each service's replicas and readiness, its consumers'
lag and dead letters, the streams (`ckpt_ha.ops.platform`). Needs only read access: the
``viewer`` principal is enough.

The local stack's processes (pids, logs) are `ckpt-ha stack status`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, render
from ckpt_ha.cli.arguments import add_json
from ckpt_ha.cli.errors import Exit

if TYPE_CHECKING:
    from ckpt_ha.cli.arguments import Parser
    from ckpt_ha.cli.contexts import Resolved
    from ckpt_ha.ops.platform import PlatformStatus
    from ckpt_ha.runtime.settings import ServiceSettings

STORAGE_TIMEOUT_S = 10.0


def register(top: Parser) -> None:
    st = top.command(
        "status",
        help="is the platform up: NATS, Redis, storage, each service's replicas and "
        "readiness, consumer lag, dead letters (exit 0 all up, 1 not, 3 unreachable)",
        handler=cmd_status,
    )
    add_json(st)


def _health(where: Resolved, home: Path) -> dict[str, list[str]]:
    """The services' health endpoints: the context's, else the local stack's own."""
    if where.context is not None:
        return {k: list(v) for k, v in where.context.health.items()}
    if where.kind != "local":
        return {}
    from ckpt_ha.ops.platform import SERVICES
    from ckpt_ha.runtime import local_stack

    state = local_stack.StackState.load(home)
    found: dict[str, list[str]] = {}
    for proc in state.processes if state is not None else ():
        if proc.name in SERVICES and proc.http_port:
            found.setdefault(proc.name, []).append(f"http://127.0.0.1:{proc.http_port}")
    return found


RedisProbe = Callable[[], Awaitable[tuple[str, dict[str, str]]]]
Probe = Callable[[], Awaitable[str]]


def _probes(settings: ServiceSettings) -> tuple[RedisProbe, Probe]:
    from ckpt_ha.registry import leases
    from ckpt_ha.registry.client import connect
    from ckpt_ha.storage import open_store

    async def redis_probe() -> tuple[str, dict[str, str]]:
        """PING, then the loop leases held now (their holder, until a time in the future of
        the server's clock)."""
        from redis.exceptions import NoPermissionError

        client = connect(settings.redis())
        said = f"PONG as {settings.redis_user or 'default'}"
        try:
            await client.ping()
            held: dict[str, str] = {}
            try:
                seconds, micros = await client.time()
                now_ms = seconds * 1000 + micros // 1000
                pattern = leases.key(settings.registry_prefix, "*")
                async for key in client.scan_iter(match=pattern, count=1000):
                    holder, until = await client.hmget(key, ["holder", "until"])
                    if holder and int(until or 0) > now_ms:
                        name = str(key).removeprefix(leases.key(settings.registry_prefix, ""))
                        held[name] = str(holder)
            except NoPermissionError as exc:  # an ACL older than this CLI: no lease view
                return f"{said}; loop leases unreadable ({exc})", {}
            return said, held
        finally:
            await client.aclose()

    def list_one() -> str:
        page = open_store(settings.storage_root).list_page(page_size=1)
        return "listed" if page.items else "listed (empty)"

    async def storage_probe() -> str:
        return await asyncio.wait_for(asyncio.to_thread(list_one), STORAGE_TIMEOUT_S)

    return redis_probe, storage_probe


def cmd_status(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.credentials import redact_url
    from ckpt_ha.ops.platform import platform_status

    where = context.where(env, home)
    settings = context.settings(env, home)
    redis_probe, storage_probe = _probes(settings)
    found: PlatformStatus = asyncio.run(
        platform_status(settings.bus(), redis_probe, storage_probe, _health(where, home))
    )
    shown = where.describe(home)
    if args.json:
        doc = {"context": where.context.name if where.context else None, "from": shown,
               **found.to_json()}  # fmt: skip
        print(render.dumps(doc))
    else:
        print(f"context: {shown}")
        deps = [
            ("NATS", redact_url(settings.nats_url), found.nats),
            ("Redis", redact_url(settings.redis_url), found.redis),
            ("storage", settings.storage_root, found.storage),
        ]
        print(render.table(
            ["DEPENDENCY", "WHERE", "REACHABLE", "DETAIL"],
            [(n, url, r.ok, r.detail) for n, url, r in deps],
        ))  # fmt: skip
        print()
        print(_services_table(found))
        if found.streams:
            print()
            print(render.table(
                ["STREAM", "MESSAGES", "BYTES", "FIRST SEQ", "LAST SEQ"],
                [(s.name, "MISSING (ckpt-ha streams provision)", "-", "-", "-") if s.missing
                 else (s.name, s.messages, s.bytes, s.first_seq, s.last_seq)
                 for s in found.streams],
            ))  # fmt: skip
        if found.leases:
            held = ", ".join(f"{n} by {h}" for n, h in sorted(found.leases.items()))
            print(f"\nloops held: {held}")
        letters = sum(found.dead_letters.values())
        print(f"\ndead letters: {letters} (replayed {found.replayed}); `ckpt-ha dead-letters` "
              "says why each was refused")  # fmt: skip
    if not (found.nats.ok and found.redis.ok and found.storage.ok):
        return Exit.UNREACHABLE
    return Exit.OK if found.healthy else Exit.NO


def _services_table(found: PlatformStatus) -> str:
    rows = []
    for r in found.service_rows():
        absent = r["missing_consumers"]
        missing = f" ({len(absent)} consumer(s) missing)" if absent else ""
        rows.append((r["service"], "yes" if r["up"] and not missing else "NO" + missing,
                     r["replicas"], r["pending"], r["ack_pending"], r["redelivered"],
                     r["dead_letters"]))  # fmt: skip
    return render.table(
        ["SERVICE", "UP", "REPLICAS", "PENDING", "ACK PENDING", "REDELIVERED", "DEAD LETTERS"],
        rows,
    )
