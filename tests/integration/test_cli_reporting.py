"""The long server-side commands against a real NATS and Redis: `registry rebuild` and
`reconcile` report progress on stderr with `--progress` (and nothing on a pipe without it),
while `--json` on stdout stays one document; `streams provision|check` answer in JSON too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore
from tests.support.cli_tools import cli
from tests.support.events import committed

pytestmark = pytest.mark.integration


async def test_registry_rebuild_reports_progress_on_stderr_and_its_counts_as_json(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    for n in range(3):
        await producer.publish(committed(f"c{n}", step=n + 1, key=f"k{n}"))
    env = {"CKPT_HA_STORAGE_ROOT": settings.storage_root}

    code, out, err = await cli(
        settings, tmp_path, "registry", "rebuild", "--json", "--progress", env=env
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["read"] == 3
    assert doc["applied"] == 3
    assert doc["skipped"] == {}
    lines = err.splitlines()
    assert lines[0] == "registry rebuild: 1 events read"
    assert lines[-1] == "registry rebuild: done, 3 events read"

    code, out, err = await cli(settings, tmp_path, "registry", "rebuild", "--clear", "--yes",
                               env=env)  # fmt: skip
    assert code == 0, err
    assert err == ""  # stderr is a pipe and nobody asked
    assert out.startswith("read 3 events: checkpoint events applied 3")


async def test_streams_provision_and_check_answer_in_json(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    code, out, err = await cli(settings, tmp_path, "streams", "provision", "--json")
    assert code == 0, err
    changes = json.loads(out)["changes"]
    assert len(changes) == 3
    assert any(settings.events_stream in line for line in changes)
    code, out, err = await cli(settings, tmp_path, "streams", "check", "--json")
    assert code == 0, err
    assert json.loads(out) == {
        "streams": [settings.events_stream, settings.dead_letter_stream, settings.progress_stream],
        "as_required": True,
    }


async def test_reconcile_reports_its_phases_on_stderr_and_json_on_stdout(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    (tmp_path / "storage").mkdir()
    store = FsStore(tmp_path / "storage")
    store.put("job-x/step-1/shard-0.bin", b"orphan")
    store.put("stray.bin", b"?")
    env = {"CKPT_HA_STORAGE_ROOT": str(store.root)}

    code, out, err = await cli(
        settings, tmp_path, "reconcile", "--json", "--progress", "--min-age", "0",
        "--delete", "--reason", "orphans", "--actor", "eve", "--yes", env=env,
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert sorted(o["key"] for o in doc["unknown"]) == ["job-x/step-1/shard-0.bin", "stray.bin"]
    assert doc["deleted"] == 2
    assert "reconcile: 2 storage objects listed" in err.splitlines()
    assert err.splitlines()[-1] == "reconcile: done, 2 deleted"

    code, out, err = await cli(settings, tmp_path, "reconcile", "--json", env=env)
    assert code == 0, err
    assert err == ""
    assert json.loads(out) == {"unknown": [], "deleted": 0}
