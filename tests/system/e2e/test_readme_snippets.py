"""The training-code snippets run as they stand: the README's (any training loop) and those of
docs/SDK.md (PyTorch DCP under torchrun, the Hugging Face Trainer).

Each ``<!-- snippet: NAME run="COMMAND" -->`` block is written to a file and started with its
command (``ckpt-ha run --job J -- python {file}``, or torchrun for the multi-rank one) against
the test's private bus, on a fresh storage root: the attempt must succeed, announce its
checkpoints, and leave only checkpoints that verify valid offline.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_ha.contracts import CATALOG
from ckpt_ha.formats import verify_path
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import stream_messages
from tests.support.cli_tools import stack_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).parents[3]
SNIPPET = re.compile(
    r'<!-- snippet: (?P<name>[a-z0-9-]+) run="(?P<run>[^"]+)" -->\n```python\n(?P<code>.*?)```',
    re.DOTALL,
)
EXPECTED = {"native", "dcp", "hf"}
PAGES = (ROOT / "README.md", ROOT / "docs" / "SDK.md")
PROGRAMS = {
    "ckpt-ha": [sys.executable, "-m", "ckpt_ha.cli.main"],
    "python": [sys.executable],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


def found() -> list[tuple[str, str, str]]:
    return [
        (m["name"], m["run"], m["code"])
        for page in PAGES
        for m in SNIPPET.finditer(page.read_text())
    ]


def snippets() -> dict[str, tuple[str, str]]:
    return {name: (run, code) for name, run, code in found()}


def test_the_docs_have_one_snippet_per_framework() -> None:
    names = [name for name, _, _ in found()]
    assert sorted(names) == sorted(EXPECTED), "each snippet once, in the README or docs/SDK.md"
    readme = {m["name"] for m in SNIPPET.finditer(PAGES[0].read_text())}
    assert readme == {"native"}, "the README shows the one-process loop"


def argv(run: str, file: Path, job: str) -> list[str]:
    out: list[str] = []
    for word in shlex.split(run):
        if word in PROGRAMS:
            out += PROGRAMS[word]
        else:
            out.append(word.replace("{file}", str(file)) if word != "J" else job)
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_a_readme_snippet_trains_and_checkpoints_under_the_runner(
    name: str, settings: ServiceSettings, tmp_path: Path, unique: str
) -> None:
    run, code = snippets()[name]
    script = tmp_path / f"train_{name}.py"
    script.write_text(code)
    storage = tmp_path / "storage"
    storage.mkdir()
    job = f"readme-{name}-{unique}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_HA_", "PET_"))}
    env.update(
        {**stack_env(settings), "CKPT_HA_HOME": str(tmp_path / "home"),
         "CKPT_HA_STORAGE_ROOT": str(storage)}
    )  # fmt: skip
    done = subprocess.run(  # noqa: ASYNC221 - the runner is the test's subject; nothing else runs
        argv(run, script, job), env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    folders = sorted(p for p in (storage / job).iterdir() if p.is_dir())
    assert len(folders) >= 2, folders
    for folder in folders:
        report = verify_path(folder)
        assert report.ok, (folder.name, report.reasons)
    committed = []
    for msg in await stream_messages(settings.nats_url, settings.events_stream):
        doc = json.loads(msg.data)
        if doc["type"].startswith("ckpt-ha.checkpoint.committed.") and doc["data"]["job_id"] == job:
            committed.append(CATALOG.decode(msg.data).data)
    assert len(committed) == len(folders)  # announced once each, also by a multi-rank save
