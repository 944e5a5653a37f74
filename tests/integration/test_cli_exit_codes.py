"""The exit-code table (`ckpt_ha.cli.errors.Exit`, docs/CLI.md#exit-codes) through the real CLI
against the real NATS, Redis and storage, and the manners of the destructive commands:
`registry rebuild` refused while the registry's writers run, `--dry-run` changing nothing,
`--clear` / `--delete` not done without `--yes` when there is no terminal to ask on."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
from pathlib import Path
from unittest import mock

from ckpt_ha.cli.main import main
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore
from tests.support.bus_tools import publish_raw, wait_for
from tests.support.cli_tools import cli, stack_env
from tests.support.events import committed


async def here(
    settings: ServiceSettings,
    home: Path,
    *args: str,
    env: dict[str, str] | None = None,
    endpoints: bool = True,
) -> tuple[int, str, str]:
    """`cli` in this process (the same `main`, arguments and environment; no interpreter start
    per call on a loaded machine). A few calls below go through `cli`, a process of its own.
    ``endpoints=False``: none in the environment (a context names them)."""
    given = stack_env(settings) if endpoints else {"NATS_URL": "", "REDIS_URL": ""}
    full = {"CKPT_HA_HOME": str(home), **given, **(env or {})}
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, full),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = await asyncio.to_thread(main, list(args))
    return code, out.getvalue(), err.getvalue()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_rebuild_is_refused_while_a_writer_runs_and_asks_before_it_clears(
    registrar: Registrar, settings: ServiceSettings, tmp_path: Path
) -> None:
    from ckpt_ha.bus.broker import Bus

    bus = Bus(settings.bus(), "test-producer")
    await bus.broker.start()
    try:
        await bus.publish(committed("c1", step=1, key="k1"))
    finally:
        await bus.broker.stop()
    await wait_for(lambda: registrar.registry.get("c1"), what="c1 recorded")
    env = {"CKPT_HA_STORAGE_ROOT": settings.storage_root}

    code, out, err = await cli(settings, tmp_path, "registry", "rebuild", "--clear", "--yes",
                               env=env)  # fmt: skip
    assert code == 4, (out, err)
    assert "the registry's writers run: registrar (registrar--checkpoints" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = await here(settings, tmp_path, "registry", "rebuild", "--clear", "--dry-run",
                               env=env)  # fmt: skip
    assert code == 1, err  # it would be refused
    assert "refused: the registry's writers run" in out
    assert await registrar.registry.get("c1") is not None

    await registrar.bus.broker.stop()  # the runbook: stop the writers first
    code, out, err = await here(settings, tmp_path, "registry", "rebuild", "--clear", "--dry-run",
                               "--json", env=env)  # fmt: skip
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["dry_run"], shown["refusals"]) == (True, [])
    assert shown["keys"] > 0
    # No terminal to ask on and no --yes: nothing is cleared.
    code, out, err = await cli(settings, tmp_path, "registry", "rebuild", "--clear", env=env)
    assert code == 5, err
    assert f"{shown['keys']} key(s) under the prefix now, deleted first" in err
    assert err.strip().endswith("not confirmed: nothing done (no terminal to ask on; pass "
                                "--yes, or --dry-run to see what it would do)")  # fmt: skip
    assert await registrar.registry.get("c1") is not None
    code, out, err = await here(settings, tmp_path, "registry", "rebuild", "--clear", "--yes",
                               env=env)  # fmt: skip
    assert code == 0, err
    assert "checkpoint events applied 1" in out


async def test_reconcile_tells_leftovers_from_failure_and_asks_before_it_deletes(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    store = FsStore(root)
    store.put("stray.bin", b"?")
    env = {"CKPT_HA_STORAGE_ROOT": str(root)}
    delete = ["--delete", "--min-age", "0", "--reason", "strays", "--actor", "eve"]

    code, out, err = await here(settings, tmp_path, "reconcile", env=env)
    assert (code, "stray.bin" in out) == (1, True), err  # leftovers: a negative answer
    code, out, err = await here(settings, tmp_path, "reconcile", *delete, "--dry-run", env=env)
    assert code == 1, err
    assert "unknown (would delete)" in out
    code, out, err = await here(settings, tmp_path, "reconcile", *delete, env=env)
    assert code == 5, err
    assert "would delete 1 object(s), 1 bytes" in err
    assert store.exists("stray.bin")
    code, out, err = await here(settings, tmp_path, "reconcile", *delete, "--yes", env=env)
    assert code == 0, err
    assert not store.exists("stray.bin")

    # A storage that cannot be listed, or a Redis that does not answer: 3, nothing done.
    gone = {"CKPT_HA_STORAGE_ROOT": str(tmp_path / "not-mounted")}
    code, out, err = await here(settings, tmp_path, "reconcile", env=gone)
    assert code == 3, (out, err)
    assert "failed, nothing done" in err
    no_redis = {**env, "REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"}
    code, out, err = await here(settings, tmp_path, "reconcile", env=no_redis)
    assert code == 3, (out, err)
    assert "cannot reach Redis" in err


async def test_one_line_and_the_tables_code_for_each_kind_of_failure(
    registrar: Registrar, settings: ServiceSettings, tmp_path: Path
) -> None:
    # Unreachable NATS: 3.
    no_nats = {"NATS_URL": f"nats://127.0.0.1:{closed_port()}"}
    code, _, err = await here(settings, tmp_path, "dead-letters", env=no_nats)
    assert code == 3, err
    assert "cannot reach NATS" in err
    # A lookup that finds nothing: 1; a refused act: 4; a bad argument: 2.
    code, _, err = await here(settings, tmp_path, "checkpoint", "show", "nope")
    assert (code, err.strip()) == (1, "ckpt-ha: no checkpoint 'nope' in the registry")
    code, _, err = await here(settings, tmp_path, "job", "show", "no-such-job")
    assert code == 1, err
    code, _, err = await here(settings, tmp_path, "tier", "set", "--job", "j", "platinum",
                             "--reason", "x", "--actor", "a")  # fmt: skip
    assert code == 4, err
    code, _, err = await here(settings, tmp_path, "dead-letters", "--limit", "0")
    assert code == 2, err
    # Half the endpoints from the environment: 2, before anything is reached.
    code, _, err = await here(settings, tmp_path, "checkpoint", "list", "--job", "j",
                             env={"REDIS_URL": ""})  # fmt: skip
    assert code == 2, err
    assert "$NATS_URL is set but $REDIS_URL is not" in err
    # Nothing to replay: done without asking.
    code, out, err = await here(settings, tmp_path, "dead-letters", "replay")
    assert (code, out.strip()) == (0, "nothing to replay"), err


async def test_status_reads_a_platform_it_did_not_start_through_a_context(
    registrar: Registrar, settings: ServiceSettings, tmp_path: Path
) -> None:
    """No local state file: a context names NATS, Redis and the storage; the registrar runs
    (in this process), the other services do not. `status` finds the registrar's replica on its
    consumers, its dead letter, and says the rest is not up (exit 1)."""
    root = tmp_path / "storage"
    root.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    (home / "contexts.toml").write_text(
        f"""
[contexts.test]
nats_url = "{settings.nats_url}"
redis_url = "{settings.redis_url}"
storage_root = "{root}"
subject_prefix = "{settings.subject_prefix}"
events_stream = "{settings.events_stream}"
dead_letter_stream = "{settings.dead_letter_stream}"
progress_stream = "{settings.progress_stream}"
registry_prefix = "{settings.registry_prefix}"
"""
    )
    # A message no service can read: the registrar dead-letters it.
    subject = f"{settings.subject_prefix}.ev.checkpoint.committed.v1.job-1"
    await publish_raw(settings.nats_url, subject, b"{broken")

    async def dead_lettered() -> bool:
        _, out, _ = await here(settings, home, "--context", "test", "status", "--json",
                                  endpoints=False)  # fmt: skip
        return bool(json.loads(out)["dead_letters"]["by_service"].get("registrar", 0) == 1)

    await wait_for(dead_lettered, timeout=30, what="the dead letter counted")
    code, out, err = await here(settings, home, "--context", "test", "status", "--json",
                                endpoints=False)  # fmt: skip
    assert code == 1, err  # reached everything; not every service is up
    doc = json.loads(out)
    assert doc["context"] == "test"
    assert (doc["nats"]["ok"], doc["redis"]["ok"], doc["storage"]["ok"]) == (True, True, True)
    rows = {r["service"]: r for r in doc["services"]}
    assert rows["registrar"]["up"], rows["registrar"]
    assert rows["registrar"]["replicas"].endswith("pulling")
    assert rows["registrar"]["dead_letters"] == 1
    assert not rows["integrity-checker"]["up"]
    assert rows["integrity-checker"]["missing_consumers"]  # never started on these streams
    code, out, err = await here(settings, home, "--context", "test", "status", endpoints=False)
    assert out.startswith(f"context: test (from {home / 'contexts.toml'})")
    assert "dead letters: 1 (replayed 0)" in out
