"""Files ckpt-ha ships beside its code, read through `importlib.resources` so they are found the
same way in a source checkout and in an installed wheel.

* ``observability/``: alert rules (and their promtool tests), Grafana dashboards, Prometheus and
  Alertmanager examples — the top-level ``observability/`` folder of the repository;
* ``nats/``: the NATS server config and the rendered permissions — ``deploy/nats/``;
* ``redis/``: the Redis server config and the rendered ACL users — ``deploy/redis/``.

In the repository both are links to those top-level folders, so there is one copy of each file;
the wheel carries the files themselves.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable


def asset(*parts: str) -> Traversable:
    """One shipped file or folder, e.g. ``asset("observability", "alerts.yml")``."""
    return files(__name__).joinpath(*parts)
