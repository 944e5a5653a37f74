"""Who may run which Redis command on which keys, rendered into ``deploy/redis/``.

Each service logs in to Redis as its own ACL user (settings ``redis_user`` and
``redis_password``) and may run only the commands its code issues, on only the key spaces it
reads or writes. Each service declares its user in its own ``access.py`` (`RedisUser`, with the
key spaces it owns, formatted by the module that owns those keys); the registry's key spaces
(`ckpt_ha.registry.keys`, `pins`, `leases`) and the operator's user are here. Two services never
share a key space: the janitor reads no key of the restore-coordinator's (it keeps its own view).
The ``default`` user is off: a connection that does not log in can do nothing.

Passwords are never in the committed file (an ACL file cannot read the environment, and allows
no comments): ``python -m ckpt_ha.registry.acl [--check]`` writes (checks) the committed
``deploy/redis/users.acl``, whose users have no password and so cannot log in; a deployment
renders its own with

    python -m ckpt_ha.registry.acl render --passwords-from-env > /etc/ckpt-ha/redis/users.acl

reading ``CKPT_HA_REDIS_PASSWORD_<USER>`` (or ``..._FILE``) for each user and writing only the
SHA-256 of each password (``#<hex>``). A key space a user only reads is granted read-only
(``%R~``, Redis 7); ``--redis-6`` renders for Redis 6.2 (the embedded stack's), which has no
read-only patterns, so there a user may write what it reads. SCAN names keys of every space (it
takes no key), which is why only operators have it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Mapping

from pydantic import SecretStr

from ckpt_ha import credentials
from ckpt_ha.assets import asset, write_or_check
from ckpt_ha.integrity_checker import access as integrity_checker
from ckpt_ha.registrar import access as registrar
from ckpt_ha.registry import leases, pins
from ckpt_ha.registry.access import CONNECT, RedisUser
from ckpt_ha.registry.keys import RegistryKeys
from ckpt_ha.restore_coordinator import access as restore_coordinator
from ckpt_ha.retention_janitor import access as retention_janitor
from ckpt_ha.writer_watcher import access as writer_watcher

CONF = asset("redis", "users.acl")
"""Shipped as package data; in a checkout it is ``deploy/redis/users.acl``."""
DEFAULT_PREFIX = "ckpt-ha"


def key_spaces(prefix: str) -> dict[str, str]:
    """Every key space by name, as the ACL key pattern its owner formats for ``prefix``: the
    registry's here, each service's own in its ``access.py``."""
    k = RegistryKeys(prefix)
    spaces = {
        "checkpoints": k.checkpoint("*"),
        "job-index": k.job("*"),
        "state-index": k.state("*"),
        "uri-index": k.uri("*"),
        "jobs": k.jobs,
        "applied": k.applied,
        "owners": k.owner("*"),
        "projects": k.project("*"),
        "owner-log": k.owner_log("*"),
        "tiers": k.tier("*"),
        "tier-log": k.tier_log("*"),
        "tier-declared": k.tier_declared("*"),
        "fences": k.fence("*"),
        "reconcile-log": k.reconcile_log,
        "stream": k.stream,
        "pins": pins.key(prefix, "*"),
        "leases": leases.key(prefix, "*"),
        "everything": k.everything,
    }
    for user in USERS:
        own = user.key_spaces(prefix)
        if twice := sorted(own.keys() & spaces.keys()):
            raise ValueError(f"key spaces with two owners ({user.user} and another): {twice}")
        spaces |= own
    return spaces


USERS: tuple[RedisUser, ...] = (
    writer_watcher.REDIS,
    integrity_checker.REDIS,
    registrar.REDIS,
    restore_coordinator.REDIS,
    retention_janitor.REDIS,
    # The CLI, drills and platform tooling: every key under the prefix (rebuild, reconcile,
    # audits, manual actions), no server administration. A rebuild writes the coordinator's
    # state as the coordinator does (its scripts, trimming included) and sets its expiry
    # (pexpireat). `status` reads the server's clock (time) to tell a held loop lease.
    RedisUser("operator", ("everything",), (),
              (*CONNECT, "get", "set", "mget", "del", "type", "scan", "expire",
               "pexpireat",
               "hset", "hget", "hmget", "hgetall", "hdel", "zadd", "zcard", "zrange",
               "zrevrange", "zpopmin", "zremrangebyrank", "zrem", "sadd", "srem", "smembers",
               "sismember", "smismember", "zscore", "zremrangebyscore", "rpush", "ltrim", "lrange",
               "evalsha", "script|load", "time", "incrby",
               "multi", "exec", "discard")),
    # On-call triage (`ckpt-ha status`, every query): reads every key under the prefix and
    # writes none. The registry's read script runs under these rights (EVALSHA checks each
    # command it calls), so it may only read; SCAN names keys only.
    RedisUser("viewer", (), ("everything",),
              (*CONNECT, "get", "mget", "type", "exists", "ttl", "pttl", "scan", "time",
               "hget", "hmget", "hgetall", "smembers", "sismember", "smismember", "scard",
               "zcard", "zrange", "zrevrange", "zscore", "zrangebyscore", "lrange", "llen",
               "evalsha", "script|load")),
)  # fmt: skip
"""The services' own declarations (each service's ``access.py``), then the operator's and the
viewer's."""


def users() -> tuple[str, ...]:
    """Every Redis user a deployment needs a password for."""
    return tuple(u.user for u in USERS)


def env_password(user: str) -> str:
    """The variable a user's password is read from (or its ``_FILE`` form)."""
    return "CKPT_HA_REDIS_PASSWORD_" + user.upper().replace("-", "_")


def password_hash(password: SecretStr) -> str:
    """The ``#<sha256 hex>`` form Redis stores and accepts in an ACL file."""
    return "#" + hashlib.sha256(password.get_secret_value().encode()).hexdigest()


def render(
    passwords: Callable[[str], SecretStr | None] = lambda user: None,
    prefix: str = DEFAULT_PREFIX,
    *,
    read_only_keys: bool = True,
) -> str:
    """The ACL file: ``default`` off, then one line per user. A user whose password is None
    gets none (it cannot log in until one is set). ``read_only_keys=False`` for Redis 6."""
    spaces = key_spaces(prefix)
    lines = ["user default off resetchannels resetkeys -@all"]
    for u in USERS:
        password = passwords(u.user)
        secret = [password_hash(password)] if password is not None else []
        read = "%R~" if read_only_keys else "~"
        keys = [f"~{spaces[name]}" for name in u.writes]
        keys += [f"{read}{spaces[name]}" for name in u.reads]
        cmds = [f"+{c}" for c in u.commands]
        lines.append(" ".join(["user", u.user, "on", *secret, "resetchannels", "resetkeys",
                               *keys, "-@all", *cmds]))  # fmt: skip
    return "\n".join(lines) + "\n"


def passwords_from(env: Mapping[str, str]) -> Callable[[str], SecretStr]:
    """Each user's password from ``env`` (`credentials.read_secret`); one missing is an error."""

    def password(user: str) -> SecretStr:
        found = credentials.read_secret(env, env_password(user))
        if found is None:
            raise credentials.CredentialsError(env_password(user), f"no password for {user}")
        return found

    return password


USAGE = (
    "usage: python -m ckpt_ha.registry.acl [--check]\n"
    "       python -m ckpt_ha.registry.acl render --passwords-from-env [--prefix P] [--redis-6]"
)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["render"]:
        rest = args[1:]
        redis_6 = "--redis-6" in rest
        rest = [a for a in rest if a != "--redis-6"]
        prefix = DEFAULT_PREFIX
        if "--prefix" in rest:
            at = rest.index("--prefix")
            prefix = rest[at + 1] if at + 1 < len(rest) else ""
            del rest[at : at + 2]
        if rest != ["--passwords-from-env"] or not prefix:
            print(USAGE, file=sys.stderr)
            return 2
        try:
            text = render(passwords_from(os.environ), prefix, read_only_keys=not redis_6)
            sys.stdout.write(text)
        except credentials.CredentialsError as exc:
            print(f"ckpt_ha.registry.acl: {exc}", file=sys.stderr)
            return 1
        return 0
    if args not in ([], ["--check"]):
        print(USAGE, file=sys.stderr)
        return 2
    return write_or_check(CONF, render(), "ckpt_ha/registry/acl.py", check=args == ["--check"])


if __name__ == "__main__":
    raise SystemExit(main())
