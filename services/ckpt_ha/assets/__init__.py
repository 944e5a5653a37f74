"""Files ckpt-ha ships beside its code, read through `importlib.resources` so they are found the
same way in a source checkout and in an installed wheel.

* ``observability/``: alert rules (and their promtool tests), Grafana dashboards, Prometheus and
  Alertmanager examples — the top-level ``observability/`` folder of the repository;
* ``nats/``: the NATS server config and the rendered permissions — ``deploy/nats/``;
* ``redis/``: the Redis server config and the rendered ACL users — ``deploy/redis/``;
* ``k8s/``: the Kubernetes manifests (kustomize base and example overlay) — ``deploy/k8s/``.

In the repository these are links to those top-level folders, so there is one copy of each file;
the wheel carries the files themselves.
"""

from __future__ import annotations

import sys
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path


def asset(*parts: str) -> Traversable:
    """One shipped file or folder, e.g. ``asset("observability", "alerts.yml")``."""
    return files(__name__).joinpath(*parts)


def write_or_check(conf: Traversable, text: str, source: str, *, check: bool) -> int:
    """Write a rendered config asset (exit code 0), or with ``check`` say whether the committed
    one still equals ``text`` (1 and a line naming ``source``, the table it is rendered from)."""
    if check:
        if not conf.is_file() or conf.read_text() != text:
            print(f"{conf} drifted from {source}", file=sys.stderr)
            return 1
        return 0
    Path(str(conf)).write_text(text)
    return 0
