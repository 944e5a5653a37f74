"""Run the real `ckpt-ha` CLI as a separate process against a test's private prefixes."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import SIGNING_KEY


def stack_env(settings: ServiceSettings) -> dict[str, str]:
    """The environment that points a CLI or a service process at the test's private broker
    subjects, streams and registry prefix."""
    return {
        "NATS_URL": settings.nats_url,
        "REDIS_URL": settings.redis_url,
        "CKPT_HA_SUBJECT_PREFIX": settings.subject_prefix,
        "CKPT_HA_EVENTS_STREAM": settings.events_stream,
        "CKPT_HA_DEAD_LETTER_STREAM": settings.dead_letter_stream,
        "CKPT_HA_PROGRESS_STREAM": settings.progress_stream,
        "CKPT_HA_REGISTRY_PREFIX": settings.registry_prefix,
        "CKPT_HA_SIGNING_KEY": SIGNING_KEY,
    }


async def cli(
    settings: ServiceSettings, home: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    extra = env
    env = {
        **os.environ,
        "CKPT_HA_HOME": str(home),
        **stack_env(settings),
    }
    env.pop("CKPT_HA_ACTOR", None)
    env.update(extra or {})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ckpt_ha.cli.main",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
