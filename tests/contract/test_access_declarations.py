"""Every service declares its access rights in its own ``access.py``, under its own name, and
the generators of ``permissions.conf`` and ``users.acl`` render exactly those declarations."""

from __future__ import annotations

import importlib

from ckpt_ha.bus import permissions
from ckpt_ha.registry import acl
from ckpt_ha.runtime.catalog import SERVICE_NAMES


def test_each_service_declares_its_own_users_and_the_generators_take_them() -> None:
    for name in SERVICE_NAMES:
        access = importlib.import_module(f"ckpt_ha.{name.replace('-', '_')}.access")
        assert access.NATS.user == access.REDIS.user == name
        assert [p for p in permissions.PRINCIPALS if p.user == name] == [access.NATS]
        assert [u for u in acl.USERS if u.user == name] == [access.REDIS]


def test_the_other_users_are_no_service() -> None:
    central = {p.user for p in permissions.PRINCIPALS} | {u.user for u in acl.USERS}
    assert central - set(SERVICE_NAMES) == {"runner", "job", "operator", "viewer"}
