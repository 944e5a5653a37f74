"""A failed rank under torchrun is reported with the rank's own cause, not torchrun's.

The fixtures in tests/data/torchrun/ are real runs of `tests/support/torchrun_rank_fault.py`
under ``torchrun --nproc_per_node 2`` (torch 2.14, gloo): torchrun's stderr, and the error file
it wrote with ``TORCHELASTIC_ERROR_FILE`` set (only when the rank raised inside ``@record``:
a rank killed by a signal leaves none, so its signal comes from torchrun's root-cause section).
"""

from __future__ import annotations

import json
import logging
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts.checkpoint import FailureSide, RuntimeEnvironment
from ckpt_ha.contracts.job import FailureCause
from ckpt_ha.runner.adapter import ERROR_FILE_BYTES, ExitInfo, read_error_file
from ckpt_ha.runner.domain import Failure, classify
from ckpt_ha.runner.launch import RunSpec, child_env
from ckpt_ha.runner.torchrun import (
    ERROR_FILE_ENV,
    MAX_RESTARTS_ENV,
    ErrorRecord,
    RankFailure,
    max_restarts,
    parse_error_file,
    rank_failure,
    world_size,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "torchrun"
BANNER = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"


def stderr_lines(mode: str) -> list[str]:
    """The fixture's stderr as `LocalProcess` keeps it: stripped, non-empty lines."""
    text = (DATA / f"{mode}.stderr").read_text()
    return [line.strip() for line in text.splitlines() if line.strip()]


def recorded(mode: str) -> ErrorRecord | None:
    path = DATA / f"{mode}.error.json"
    return parse_error_file(path.read_text()) if path.exists() else None


def torchrun_exit(mode: str, **changes: object) -> ExitInfo:
    """The ExitInfo of the real run: torchrun exited 1 whatever the rank did."""
    lines = stderr_lines(mode)
    info = ExitInfo(1, last_error_line=lines[-1], rank=rank_failure(lines, recorded(mode)))
    return replace(info, **changes)  # type: ignore[arg-type]


def failed(info: ExitInfo, **kwargs: int) -> Failure:
    failure = classify(info, **kwargs)
    assert failure is not None
    return failure


def test_torchrun_itself_says_only_exit_1_and_a_banner() -> None:
    """Why the rank's report is needed: torchrun's own ending is the same whatever the rank
    did, and a signature built from it could not tell an exit from an exception."""
    modes = ("kill", "exit", "raise", "record")
    endings = [torchrun_exit(mode) for mode in modes]
    assert {(info.exit_code, info.signal) for info in endings} == {(1, None)}
    assert all(set(info.last_error_line) == {"="} for info in endings)
    blind = {failed(replace(info, rank=None)).signature for info in endings[1:]}
    assert len(blind) == 1
    assert len({failed(info).signature for info in endings[1:]}) == 2  # exit 3; the exception


def test_a_sigkilled_rank_is_a_node_exit_naming_the_rank() -> None:
    assert recorded("kill") is None  # a killed rank writes nothing, so torchrun copies nothing
    info = torchrun_exit("kill")
    assert info.rank == RankFailure(rank=1, exit_code=None, signal=signal.SIGKILL)
    failure = failed(info)
    assert (failure.cause, failure.side) == (FailureCause.NODE_EXIT, FailureSide.INFRASTRUCTURE)
    assert (failure.exit_code, failure.signal) == (None, signal.SIGKILL)
    assert failure.detail.startswith("rank 1 (torchrun): killed by SIGKILL")
    assert "torchrun ended the group and exited 1" in failure.detail
    assert BANNER not in failure.detail
    assert failure.signature == failed(ExitInfo(None, signal.SIGKILL)).signature


def test_a_rank_killed_by_the_oom_killer_is_oom() -> None:
    failure = failed(torchrun_exit("kill", oom_killed=True))
    assert (failure.cause, failure.side) == (FailureCause.OOM, FailureSide.JOB)
    assert "rank 1" in failure.detail


def test_a_rank_exit_code_is_the_jobs_error_with_that_code() -> None:
    failure = failed(torchrun_exit("exit"))
    assert (failure.cause, failure.side) == (FailureCause.ERROR, FailureSide.JOB)
    assert (failure.exit_code, failure.signal) == (3, None)
    assert failure.detail.startswith("rank 1 (torchrun): exit code 3")
    assert "To enable traceback" not in failure.detail  # torchrun's hint is not the rank's error


def test_a_raising_rank_is_signed_by_its_own_exception() -> None:
    """With ``@record`` the message comes from the error file; without, from the line torch
    prefixed with ``[rank1]:``. Both are the rank's exception, so both sign the same."""
    record = recorded("record")
    assert record == ErrorRecord("ValueError: loss is nan at step 18", 1)
    with_file, without = failed(torchrun_exit("record")), failed(torchrun_exit("raise"))
    for failure in (with_file, without):
        assert (failure.cause, failure.side, failure.exit_code) == (
            FailureCause.ERROR,
            FailureSide.JOB,
            1,
        )
        assert failure.detail.endswith("the rank: ValueError: loss is nan at step 18")
    assert with_file.signature == without.signature
    assert with_file.signature != failed(torchrun_exit("exit")).signature
    assert with_file.signature != failed(torchrun_exit("kill")).signature


def test_the_rank_signature_ignores_numbers_but_not_the_exception() -> None:
    text = (DATA / "record.error.json").read_text()
    later = parse_error_file(text.replace("step 18", "step 1234"))
    other = parse_error_file(text.replace("ValueError: loss is nan", "KeyError: 'batch'"))
    lines = stderr_lines("record")
    base = failed(torchrun_exit("record")).signature
    assert failed(ExitInfo(1, rank=rank_failure(lines, later))).signature == base
    assert failed(ExitInfo(1, rank=rank_failure(lines, other))).signature != base


def test_the_error_file_alone_still_names_the_cause() -> None:
    """torchrun's stderr redirected away (a wrapper script): the error file still tells."""
    failure = failed(ExitInfo(1, rank=rank_failure([], recorded("record"))))
    assert failure.cause is FailureCause.ERROR
    assert failure.detail.startswith("a rank (torchrun): exit code 1")
    signalled = rank_failure([], ErrorRecord("", -signal.SIGSEGV))
    assert signalled == RankFailure(None, None, signal.SIGSEGV)


def test_without_torchrun_report_the_command_decides_as_before() -> None:
    assert rank_failure(["Traceback (most recent call last):", "ValueError: x"], None) is None
    # torchrun killed itself: nothing to read, its own signal decides.
    killed = failed(ExitInfo(None, signal.SIGKILL, rank=torchrun_exit("exit").rank))
    assert (killed.cause, killed.exit_code, killed.signal) == (
        FailureCause.NODE_EXIT,
        None,
        signal.SIGKILL,
    )
    assert "rank" not in killed.detail
    stopped = failed(torchrun_exit("kill"), forwarded=signal.SIGTERM)
    assert stopped.cause is FailureCause.PREEMPTED


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "\x00\xff garbage",
        "[" * 100_000 + "]" * 100_000,
        "42",
        '{"message": "RendezvousTimeoutError: no peers"}',
        # torchrun's own exception, or a plain command's @record: no errorCode.
        '{"message": {"message": "RendezvousTimeoutError: x", "extraInfo": {}}}',
        '{"message": {"message": "x", "errorCode": "1"}}',
        '{"message": {"message": "x", "errorCode": true}}',
        '{"message": {"message": ["x"], "errorCode": 1, "extraInfo": 7}}',
    ],
)
def test_a_garbled_error_file_never_crashes_nor_invents_a_message(text: str) -> None:
    record = parse_error_file(text)
    assert record is None or record == ErrorRecord("", 1)
    failure = failed(ExitInfo(1, last_error_line="boom", rank=rank_failure([], record)))
    assert failure.cause is FailureCause.ERROR


def test_a_garbled_root_cause_section_never_crashes() -> None:
    marker = "Root Cause (first observed failure):"
    odd = rank_failure([marker, "rank : 7", "exitcode : -99999999999", "rank : 8"], None)
    assert odd == RankFailure(7, None, 99999999999)
    assert "killed by signal 99999999999" in failed(ExitInfo(1, rank=odd)).detail
    assert rank_failure([marker, "rank : 7", "=" * 20, "exitcode : 1"], None) is None
    assert rank_failure([marker], None) is None


def test_reading_the_error_file_is_bounded_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ckpt_ha.runner")
    assert read_error_file(None) is None
    assert read_error_file(str(tmp_path / "absent.json")) is None
    assert caplog.records == []
    real = tmp_path / "real.json"
    real.write_bytes((DATA / "record.error.json").read_bytes())
    assert read_error_file(str(real)) == recorded("record")
    huge = tmp_path / "huge.json"
    message = "x" * (ERROR_FILE_BYTES + 1)
    huge.write_text(json.dumps({"message": {"message": message, "errorCode": 1}}))
    garbled = tmp_path / "garbled.json"
    garbled.write_bytes(b"\xff\xfe{not json")
    assert read_error_file(str(huge)) is None
    assert read_error_file(str(garbled)) is None
    assert read_error_file(str(tmp_path)) is None  # a folder: unreadable
    assert len(caplog.records) == 3
    assert all("ignoring the torchrun error file" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("command", "env", "restarts"),
    [
        (["python", "train.py"], {}, None),
        (["torchrun", "--nproc_per_node", "2", "train.py"], {}, 0),
        (["/opt/bin/torchrun", "--max-restarts", "3", "train.py"], {}, 3),
        (["torchrun", "--standalone", "--max_restarts=2", "train.py", "--lr", "1"], {}, 2),
        (["torchrun", "--nnodes", "1", "train.py"], {MAX_RESTARTS_ENV: "4"}, 4),
        (["torchrun", "--max-restarts", "1", "train.py"], {MAX_RESTARTS_ENV: "4"}, 1),
        # The training script's own option of that name is not torchrun's.
        (["torchrun", "--standalone", "train.py", "--max-restarts", "5"], {}, 0),
        (["python3.11", "-u", "-m", "torch.distributed.run", "--max-restarts", "2", "t.py"], {}, 2),
        (["python", "-m", "torch.distributed.launch", "--max_restarts", "1", "t.py"], {}, 1),
        (["python", "-m", "mypkg.run", "--max-restarts", "2"], {}, None),
        (["torchrun", "--max-restarts", "many", "train.py"], {}, 0),
        (["torchrun", "--max-restarts"], {}, 0),
    ],
)
def test_torchruns_own_restarts_are_read_from_its_command_line(
    command: list[str], env: dict[str, str], restarts: int | None
) -> None:
    assert max_restarts(command, env) == restarts


@pytest.mark.parametrize(
    ("command", "env", "size"),
    [
        (["python", "train.py"], {}, None),
        (["torchrun", "train.py"], {}, 1),
        (["torchrun", "--nproc_per_node", "2", "train.py"], {}, 2),
        (["torchrun", "--nproc-per-node=4", "--nnodes", "2", "train.py"], {}, 8),
        (["torchrun", "--nnodes", "1:3", "--nproc_per_node", "2", "train.py"], {}, None),
        (["torchrun", "--nnodes", "2:2", "--nproc_per_node", "2", "train.py"], {}, 4),
        (["torchrun", "--nproc_per_node", "auto", "train.py"], {}, None),
        (["torchrun", "train.py"], {"PET_NPROC_PER_NODE": "3"}, 3),
        (["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
          "t.py", "--nproc_per_node", "9"], {}, 2),
    ],
)  # fmt: skip
def test_torchruns_world_size_is_read_from_its_command_line(
    command: list[str], env: dict[str, str], size: int | None
) -> None:
    """What `ckpt-ha run` records as the topology when --world-size is not given."""
    assert world_size(command, env) == size


def test_a_failure_after_torchruns_own_restarts_says_so() -> None:
    failure = failed(torchrun_exit("kill"), elastic_restarts=2)
    assert "exited 1 after using its --max-restarts 2" in failure.detail
    assert failure.signature == failed(torchrun_exit("kill")).signature


def test_every_attempt_gets_its_own_error_file_in_the_run_state(tmp_path: Path) -> None:
    spec = RunSpec("job-t", "run-t", ("torchrun", "train.py"), "/data", tmp_path)
    bus, environment = BusConfig(url="nats://n:4222"), RuntimeEnvironment()
    base = {ERROR_FILE_ENV: "/elsewhere.json"}
    first = child_env(base, spec, bus, 1, environment, None)[ERROR_FILE_ENV]
    second = child_env(base, spec, bus, 2, environment, None)[ERROR_FILE_ENV]
    assert Path(first).parent == Path(second).parent == tmp_path
    assert first != second
