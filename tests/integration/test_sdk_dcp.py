"""`ckpt_ha.sdk.dcp` with real torch, a real ``torchrun`` (2 ranks, gloo) and the real broker.

One torchrun launch runs every multi-rank scenario (tests/support/dcp_worker.py): a save that
each rank writes its own shards of and rank 0 commits once, announced once; a resume that loads
bit-exact tensors on both ranks; a truncated shard of rank 1, refused by every rank and blamed
on the checkpoint with rank 1; an async save during which a training step runs and nothing is
committed until the data is written. The rest runs in this process (no process group).
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import platform
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha import sdk
from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts.checkpoint import RuntimeEnvironment
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import sidecar, verify_path
from ckpt_ha.formats.identity import checkpoint_id
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.sdk import protocol
from ckpt_ha.storage import FsStore
from tests.integration.test_sdk_announce import watcher_pass
from tests.support.bus_tools import job_key, stream_messages
from tests.support.resume_tools import plan_for
from tests.support.torch_tools import (
    ExecPayload,
    Payload,
    require_torch,
    tensor_bits,
    training_state,
    write_dcp,
    zeroed_like,
)

pytestmark = [
    pytest.mark.integration,
    # torch says so each time DCP runs without a process group: the one-process tests do
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

REPO = Path(__file__).resolve().parents[2]
torch = require_torch()
from ckpt_ha.sdk import dcp  # noqa: E402  (after require_torch: a missing torch fails, not errors)


async def all_events(settings: ServiceSettings) -> list[dict[str, Any]]:
    """Every event on the test's stream as (type without version, data)."""
    out = []
    for msg in await stream_messages(settings.nats_url, settings.events_stream):
        doc = json.loads(msg.data)
        out.append({**doc, "type": doc["type"].removeprefix("ckpt-ha.").rsplit(".v", 1)[0]})
    return out


def of(events: list[dict[str, Any]], event_type: str, **match: object) -> list[dict[str, Any]]:
    return [
        e["data"]
        for e in events
        if e["type"] == event_type and all(e["data"].get(k) == v for k, v in match.items())
    ]


def runner_env(settings: ServiceSettings, root: Path, job: str, **extra: str) -> dict[str, str]:
    return {
        protocol.JOB: job,
        protocol.RUN_ID: "run-1",
        protocol.ATTEMPT: "1",
        protocol.STORAGE_ROOT: str(root),
        protocol.NATS_URL: settings.nats_url,
        protocol.SUBJECT_PREFIX: settings.subject_prefix,
        protocol.JOB_KEY: job_key(job).hex(),
        **extra,
    }


def dcp_plan(root: Path, job: str, step: int) -> Any:
    return plan_for(root, job, step).model_copy(update={"checkpoint_format": "torch_dcp"})


def zeroed(state: dict[str, Any]) -> dict[str, Any]:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}


# -- two ranks under torchrun ------------------------------------------------------------------


async def test_two_ranks_under_torchrun(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    root, out = tmp_path / "root", tmp_path / "out"
    root.mkdir()
    out.mkdir()
    environment = RuntimeEnvironment(
        framework="torch",
        framework_version=str(torch.__version__),
        python_version=platform.python_version(),
    )
    env = {
        **os.environ,
        **runner_env(settings, root, "unused"),
        protocol.ENVIRONMENT: environment.model_dump_json(),
        protocol.CODE_VERSION: "abc123",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(REPO / "tests" / "support" / "dcp_worker.py"), str(out),
        cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(proc.communicate(), timeout=100)
    assert proc.returncode == 0, output.decode()[-4000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    events = await all_events(settings)

    check_save(ranks, events, root, environment)
    check_resume(ranks, events)
    check_truncated(ranks, events)
    check_async(ranks, events)
    check_plain(ranks, root)
    await check_reshard(settings, root)


def check_save(
    ranks: list[dict[str, Any]],
    events: list[dict[str, Any]],
    root: Path,
    environment: RuntimeEnvironment,
) -> None:
    saved = ranks[0]["save"]
    assert ranks[1]["save"] == {**saved, "own_files": ranks[1]["save"]["own_files"]}
    assert ranks[0]["save"]["own_files"] == ["__0_0.distcp"]  # each rank wrote its own shard
    assert ranks[1]["save"]["own_files"] == ["__1_0.distcp"]
    folder = root / "job-save" / "step-00000010"
    commit = sidecar.parse_commit((folder / sidecar.COMMIT).read_bytes())
    assert sorted(commit.files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for name, evidence in commit.files.items():
        data = (folder / name).read_bytes()
        assert (evidence.size, evidence.checksum) == (
            len(data),
            cs.of_bytes(data, cs.WRITE_ALGORITHM),
        )
    assert commit.step == 10
    # The intent is the folder's first file: the id the watcher derives from the listing.
    first = min(FsStore(root).list("job-save/step-00000010/"), key=lambda i: i.mtime)
    assert first.key.endswith(sidecar.INTENT)
    assert saved["checkpoint_id"] == checkpoint_id("job-save/step-00000010", first.mtime)

    [writing] = of(events, "checkpoint.writing", job_id="job-save")
    [committed] = of(events, "checkpoint.committed", job_id="job-save")
    for event in (writing, committed):
        assert (event["checkpoint_id"], event["step"]) == (saved["checkpoint_id"], 10)
        assert (event["format"], event["uri"]) == ("torch_dcp", saved["uri"])
    identity = committed["identity"]
    assert identity["environment"] == environment.model_dump(mode="json")  # as job.started
    assert (identity["code_version"], identity["topology"]["world_size"]) == ("abc123", 2)
    assert (committed["shard_count"], committed["total_bytes"]) == (
        3, sum(e.size for e in commit.files.values()),
    )  # fmt: skip
    intent = sidecar.parse_intent((folder / sidecar.INTENT).read_bytes())
    assert intent.identity.model_dump(mode="json") == identity
    assert (intent.format, intent.world_size, intent.step) == ("torch_dcp", 2, 10)
    assert verify_path(folder).ok  # the offline verdict agrees
    assert [rank["exists"] for rank in ranks] == [saved["uri"]] * 2  # saving it again: refused


async def check_reshard(settings: ServiceSettings, root: Path) -> None:
    """The 2-rank checkpoint taken over by one process (a host lost, no spare): DCP reshards it,
    the global state comes back bit for bit, and ``resume.loaded`` says it was written by 2."""
    plan = dcp_plan(root, "job-save", 10)
    env = runner_env(settings, root, "job-save", **{protocol.RESUME_PLAN: plan.model_dump_json()})
    target = zeroed_like(torch, training_state(torch, step=10))
    resumed = dcp.resume(target, ctx=sdk.context(env))
    assert resumed is not None
    assert tensor_bits(torch, target) == tensor_bits(torch, training_state(torch, step=10))
    [loaded] = of(await all_events(settings), "resume.loaded", plan_id=plan.plan_id)
    assert (loaded["world_size"], loaded["written_world_size"]) == (1, 2)


def check_plain(ranks: list[dict[str, Any]], root: Path) -> None:
    """Plain torchrun: no rank's own part becomes a native checkpoint (issue 28)."""
    for rank in ranks:
        assert rank["plain"]["refused"] == {"source": "launcher", "rank": rank["rank"], "world": 2}
    assert not (root / "job-plain" / "step-00000005").exists()
    whole = ranks[0]["plain"]["whole"]
    assert whole["whole_state"] is True
    assert verify_path(root / "job-plain" / "step-00000006").ok


def check_resume(ranks: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["resume"]["bit_exact"], f"rank {rank['rank']} did not load bit-exact"
        assert rank["resume"]["compared"] > 20
        assert (rank["resume"]["step"], rank["resume"]["checksums_verified"]) == (10, True)
    [loaded] = of(events, "resume.loaded", plan_id=ranks[0]["resume"]["plan_id"])
    assert (loaded["checkpoint_id"], loaded["step"]) == (ranks[0]["resume"]["checkpoint_id"], 10)
    assert (loaded["attempt"], loaded["data_position"]) == (2, 40)  # rank 0's describe
    assert loaded["rng_fingerprint"] == sdk.fingerprint("x")
    assert of(events, "resume.load_failed", plan_id=ranks[0]["resume"]["plan_id"]) == []


def check_truncated(ranks: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    plan_id = ranks[0]["truncated"]["plan_id"]
    for rank in ranks:  # every rank refused to go on, naming the rank whose check failed
        raised = rank["truncated"]["raised"]
        assert raised is not None, f"rank {rank['rank']} resumed from a truncated checkpoint"
        assert "rank 1: " in raised
        assert "__1_0.distcp" in raised
    [failed] = of(events, "resume.load_failed", plan_id=plan_id)
    assert (failed["blame"], failed["side"], failed["rank"]) == ("checkpoint", "infrastructure", 1)
    assert "the commit says" in failed["reason"]
    assert of(events, "resume.loaded", plan_id=plan_id) == []
    assert len(of(events, "checkpoint.committed", job_id="job-trunc")) == 1


def check_async(ranks: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    for rank in ranks:
        run = rank["async"]
        assert run["in_flight_after_return"]
        assert run["stepped_while_in_flight"]  # training went on while the save was held
        assert run["files_while_held"] == [sidecar.INTENT]  # nothing committed before the data
        assert sidecar.COMMIT in run["files_after"]
        assert run["commit_files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert run["saved_the_pre_step_state"]  # staged before the step changed the weights
    [writing] = of(events, "checkpoint.writing", job_id="job-async")
    [committed] = of(events, "checkpoint.committed", job_id="job-async")
    assert (
        writing["checkpoint_id"] == committed["checkpoint_id"] == ranks[0]["async"]["checkpoint_id"]
    )


# -- one process -------------------------------------------------------------------------------


async def test_save_in_one_process_commits_and_announces_once(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    ctx = sdk.context(runner_env(settings, tmp_path, "job-one"))
    saved = dcp.save(training_state(torch, step=3), step=3, ctx=ctx, data_position=96)
    folder = tmp_path / "job-one" / "step-00000003"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [".metadata", "__0_0.distcp", sidecar.INTENT, sidecar.COMMIT]
    )
    commit = sidecar.parse_commit((folder / sidecar.COMMIT).read_bytes())
    assert commit == saved.commit
    assert (commit.step, commit.data_position) == (3, 96)
    intent = sidecar.parse_intent((folder / sidecar.INTENT).read_bytes())
    assert intent.identity.topology is not None
    assert intent.identity.topology.world_size == 1
    assert intent.identity.environment is not None
    assert intent.identity.environment.framework == "torch"
    events = await all_events(settings)
    assert [e["type"] for e in events] == ["checkpoint.writing", "checkpoint.committed"]
    assert {e["data"]["checkpoint_id"] for e in events} == {saved.checkpoint_id}
    assert saved.announced
    assert saved.announced_writing


async def test_the_writer_watcher_derives_the_same_checkpoint(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    """The SDK's events carry the ids the watcher gives the same facts: when it reports the
    committed folder too, the stream still holds one writing and one committed."""
    ctx = sdk.context(runner_env(settings, tmp_path, "job-w"))
    saved = dcp.save(training_state(torch, step=4), step=4, ctx=ctx)
    assert await watcher_pass(settings, tmp_path) == {"job-w/step-00000004": saved.checkpoint_id}
    events = await all_events(settings)
    assert [e["type"] for e in events] == ["checkpoint.writing", "checkpoint.committed"]
    assert {e["source"] for e in events} == {"ckpt-ha/sdk"}  # the watcher's copies were dropped


def test_prepare_async_allocates_the_copy_the_first_async_save_copies_into(
    tmp_path: Path,
) -> None:
    """The staging copy exists before the first `async_save`, which reuses it (no allocation
    stalls the loop), and the save is committed and verifies."""
    from ckpt_ha.sdk.dcp import background

    state = training_state(torch, step=5)
    dcp.prepare_async(state)
    stager = background._BACKGROUND.stager
    assert stager is not None
    mapping = stager._state_dict_stager._cached_storage_mapping
    copies = {id(copy) for _, copy in mapping.items()}
    assert copies  # every tensor's CPU copy, allocated now
    saved = dcp.async_save(state, step=5, job_id="job-p", storage_root=str(tmp_path),
                           run_id="r1").result(timeout=120)  # fmt: skip
    assert background._BACKGROUND.stager is stager
    assert {id(copy) for _, copy in mapping.items()} == copies  # copied into, not allocated
    assert saved.step == 5
    assert verify_path(tmp_path / "job-p" / "step-00000005").ok


def test_async_save_into_a_folder_that_holds_files_is_refused_by_the_call(tmp_path: Path) -> None:
    """A folder that holds files is refused by the call itself (not through its future),
    nothing is written into it, and the next save of the process goes on."""
    folder = tmp_path / "job-y" / "step-00000004"
    folder.mkdir(parents=True)
    (folder / "leftover.bin").write_bytes(b"x")
    state = training_state(torch, step=4)
    with pytest.raises(sdk.CheckpointExists):
        dcp.async_save(state, step=4, job_id="job-y", storage_root=str(tmp_path), run_id="r1")
    assert sorted(p.name for p in folder.iterdir()) == ["leftover.bin"]
    saved = dcp.async_save(state, step=5, job_id="job-y", storage_root=str(tmp_path),
                           run_id="r1").result(timeout=120)  # fmt: skip
    assert saved.step == 5
    assert verify_path(tmp_path / "job-y" / "step-00000005").ok


class _App:
    """A `Stateful` value, as DCP's examples wrap a model: DCP saves its ``state_dict()``. It
    holds what cannot be copied (a lock, as a data loader or a trainer does): only its state
    dict is staged, never the object."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.lock = threading.Lock()

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])


def test_async_save_stages_a_stateful_value_by_its_state_dict(tmp_path: Path) -> None:
    """`prepare_async` copies a `Stateful` value's state dict, as ``dcp.async_save`` does (it
    deep-copied the object before, which fails on a lock): the save copies into the prepared
    copy and holds the values the model had when the call returned, not a later step's."""
    from torch.distributed.checkpoint import load as dcp_load

    from ckpt_ha.sdk.dcp import background

    torch.manual_seed(1)
    model = torch.nn.Linear(4, 2)
    app = {"app": _App(model)}
    dcp.prepare_async(app)
    stager = background._BACKGROUND.stager
    assert stager is not None
    mapping = stager._state_dict_stager._cached_storage_mapping
    copies = {id(copy) for _, copy in mapping.items()}
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    handle = dcp.async_save(app, step=2, job_id="job-st", storage_root=str(tmp_path), run_id="r1")
    with torch.no_grad():
        model.weight.add_(1.0)  # the next step, while the files are written
    handle.result(timeout=120)
    assert {id(copy) for _, copy in mapping.items()} == copies  # copied into, not allocated
    folder = tmp_path / "job-st" / "step-00000002"
    assert verify_path(folder).ok
    loaded = {"app": {"model": {k: torch.zeros_like(v) for k, v in expected.items()}}}
    dcp_load(loaded, checkpoint_id=str(folder), no_dist=True)
    assert all(torch.equal(loaded["app"]["model"][k], v) for k, v in expected.items())


def test_a_folder_that_holds_files_is_never_written_into(tmp_path: Path) -> None:
    folder = tmp_path / "job-x" / "step-00000004"
    folder.mkdir(parents=True)
    (folder / "leftover.bin").write_bytes(b"x")
    with pytest.raises(sdk.CheckpointExists):
        dcp.save(training_state(torch), step=4, job_id="job-x", storage_root=str(tmp_path),
                 run_id="r1")  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["leftover.bin"]


def test_an_object_store_root_is_refused_plainly() -> None:
    with pytest.raises(dcp.NeedsFilesystemRoot, match="needs a filesystem storage root"):
        dcp.save(training_state(torch), step=1, job_id="job-s3", storage_root="s3://bucket/ckpts",
                 run_id="r1")  # fmt: skip


def test_resume_without_a_plan_is_a_fresh_start(tmp_path: Path) -> None:
    ctx = sdk.Context("job-f", "run-1", 1, str(tmp_path), None)
    assert dcp.resume(training_state(torch), ctx=ctx) is None


async def test_resume_of_a_plain_dcp_save_checks_sizes_and_says_so(
    settings: ServiceSettings, producer: Bus, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder written by plain ``dcp.save`` has no commit sidecar: loaded, sizes checked."""
    state = {"w": torch.arange(12, dtype=torch.float32), "step": 7}
    write_dcp(tmp_path / "job-p" / "step-00000007", state)
    plan = dcp_plan(tmp_path, "job-p", 7)
    env = runner_env(settings, tmp_path, "job-p", **{protocol.RESUME_PLAN: plan.model_dump_json()})
    target = {"w": torch.zeros(12), "step": 0}
    resumed = dcp.resume(target, ctx=sdk.context(env))
    assert resumed is not None
    assert (resumed.step, resumed.checksums_verified) == (7, False)
    assert torch.equal(target["w"], state["w"])
    assert target["step"] == 7
    assert "only the file sizes" in caplog.text
    [loaded] = of(await all_events(settings), "resume.loaded")
    assert (loaded["plan_id"], loaded["step"]) == (plan.plan_id, 7)


@pytest.mark.parametrize("how", ["plain_dcp", "ckpt_ha"])
async def test_a_hostile_metadata_pickle_never_runs(
    settings: ServiceSettings, producer: Bus, tmp_path: Path, how: str
) -> None:
    """PyTorch's reader would unpickle ``.metadata`` unrestricted; resume never lets it."""
    folder = tmp_path / "job-h" / "step-00000005"
    state = {"w": torch.ones(4)}
    if how == "plain_dcp":
        write_dcp(folder, state)
    else:
        dcp.save(state, step=5, job_id="job-h", storage_root=str(tmp_path), run_id="run-1")
    marker = tmp_path / "pwned"
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    plan = dcp_plan(tmp_path, "job-h", 5)
    env = runner_env(settings, tmp_path, "job-h", **{protocol.RESUME_PLAN: plan.model_dump_json()})
    with pytest.raises(sdk.ResumeFailed, match="refusing to unpickle"):
        dcp.resume({"w": torch.zeros(4)}, ctx=sdk.context(env))
    assert not marker.exists()
    [failed] = of(await all_events(settings), "resume.load_failed")
    assert (failed["blame"], failed["rank"]) == ("checkpoint", None)
    assert "unsafe" in failed["reason"]
    assert "system" in failed["reason"]  # the global it asked for, named


async def test_a_hostile_pickled_item_never_runs(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    """DCP's loader unpickles non-tensor items unrestricted: each is checked weights-only."""
    marker = tmp_path / "pwned"
    write_dcp(tmp_path / "job-e" / "step-00000002", {"w": torch.ones(2), "x": ExecPayload(marker)})
    plan = dcp_plan(tmp_path, "job-e", 2)
    env = runner_env(settings, tmp_path, "job-e", **{protocol.RESUME_PLAN: plan.model_dump_json()})
    with pytest.raises(sdk.ResumeFailed, match="weights_only"):
        dcp.resume({"w": torch.zeros(2), "x": None}, ctx=sdk.context(env))
    assert not marker.exists()
    [failed] = of(await all_events(settings), "resume.load_failed")
    assert failed["blame"] == "checkpoint"


@pytest.mark.parametrize(
    ("damage", "reason"),
    [("flipped_byte", "checksum mismatch"), ("replaced_folder", "now holds checkpoint")],
)
async def test_a_damaged_or_replaced_checkpoint_blames_the_checkpoint(
    settings: ServiceSettings, producer: Bus, tmp_path: Path, damage: str, reason: str
) -> None:
    def save() -> None:
        dcp.save(training_state(torch), step=6, job_id="job-d", storage_root=str(tmp_path),
                 run_id="run-1")  # fmt: skip

    save()
    plan = dcp_plan(tmp_path, "job-d", 6)
    folder = tmp_path / "job-d" / "step-00000006"
    if damage == "flipped_byte":  # same size: only the checksum can tell
        shard = folder / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:  # the same step saved again later: another checkpoint id
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
        save()
    env = runner_env(settings, tmp_path, "job-d", **{protocol.RESUME_PLAN: plan.model_dump_json()})
    target = zeroed(training_state(torch))
    with pytest.raises(sdk.ResumeFailed, match=reason):
        dcp.resume(target, ctx=sdk.context(env))
    [failed] = of(await all_events(settings), "resume.load_failed")
    assert (failed["blame"], failed["side"]) == ("checkpoint", "infrastructure")


async def test_a_plan_of_another_format_blames_the_attempt(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    """R7: the DCP loader given a native checkpoint says which loader reads it; the checkpoint
    stays valid."""
    sdk.save(str(tmp_path), "job-n", 8, {"w": torch.ones(3)}, run_id="run-1")
    plan = plan_for(tmp_path, "job-n", 8).model_copy(update={"checkpoint_format": "native"})
    env = runner_env(settings, tmp_path, "job-n", **{protocol.RESUME_PLAN: plan.model_dump_json()})
    with pytest.raises(sdk.ResumeFailed, match=r"ckpt_ha\.sdk\.resume\(\)"):
        dcp.resume({"w": torch.zeros(3)}, ctx=sdk.context(env))
    [failed] = of(await all_events(settings), "resume.load_failed")
    assert (failed["blame"], failed["side"]) == ("attempt", "job")
