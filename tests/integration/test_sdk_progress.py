"""`sdk.progress` against the real broker: one background connection, never a blocked step.

Many reports go out over one connection; while the broker does not answer (a held connection)
or cannot be reached (a closed port) every call returns at once, the queue keeps the newest
reports, and what had to be dropped is counted, logged once and carried in the next report.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from ckpt_ha import sdk
from ckpt_ha.bus.broker import Bus
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.sdk import protocol, publisher
from tests.support.bus_tools import job_key, stream_messages, wait_for
from tests.support.tcp_gate import TcpGate

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def fresh_publishers() -> Iterator[None]:
    """Each test starts without publishers and leaves none running."""
    publisher.close_all()
    yield
    publisher.close_all()


async def progress_events(settings: ServiceSettings, n: int) -> list[dict[str, object]]:
    out = []
    for msg in await stream_messages(settings.nats_url, settings.progress_stream):
        doc = json.loads(msg.data)
        if doc["type"] == "ckpt-ha.job.progress.v1":
            out.append(doc["data"])
    return out if len(out) >= n else []


def ctx_for(bus: sdk.BusEndpoint, job: str, tmp_path: Path) -> sdk.Context:
    return sdk.Context(job, "run-1", 1, str(tmp_path), bus, progress_file=str(tmp_path / "p"))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_many_reports_go_out_over_one_connection(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    bus = sdk.BusEndpoint(
        settings.nats_url, prefix=settings.subject_prefix, job_key=job_key("job-many")
    )
    ctx = ctx_for(bus, "job-many", tmp_path)
    for step in range(1, 201):
        assert sdk.progress(step, metrics={"loss": 1 / step}, ctx=ctx)
    assert sdk.flush_progress(10)
    # The progress stream keeps a job's newest reports (CKPT_HA_PROGRESS_PER_JOB, 100).
    reports = await wait_for(lambda: progress_events(settings, 100), what="100 job.progress")
    assert [r["step"] for r in reports] == list(range(101, 201))  # in order, none twice
    assert {r["dropped_reports"] for r in reports} == {0}
    stats = sdk.progress_stats(bus)
    assert stats is not None
    assert (stats.published, stats.lost, stats.queued) == (200, 0, 0)
    assert stats.connects == 1
    assert (tmp_path / "p").read_text() == "200\n"


async def test_a_broker_that_does_not_answer_never_holds_a_step(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    """The connection is held unanswered: the calls return at once, the queue keeps the newest
    reports, and once the broker answers the next report says how many were dropped."""
    nats = urlparse(settings.nats_url)
    with TcpGate((nats.hostname or "127.0.0.1", nats.port or 4222)) as gate:
        bus = sdk.BusEndpoint(
            gate.url, prefix=settings.subject_prefix, timeout_s=20, progress_queue=5
        )
        ctx = ctx_for(bus, "job-held", tmp_path)
        started = time.monotonic()
        accepted = [sdk.progress(step, ctx=ctx) for step in range(1, 21)]
        elapsed = time.monotonic() - started
        assert elapsed < 2.0  # a connect waits up to 20 s: no call waited for it
        assert accepted == [True] * 5 + [False] * 15  # each of the last 15 pushed one out
        stats = sdk.progress_stats(bus)
        assert stats is not None
        assert (stats.queued, stats.dropped, stats.published, stats.connects) == (5, 15, 0, 0)

        gate.open()
        assert sdk.flush_progress(20)
        reports = await wait_for(lambda: progress_events(settings, 5), what="the kept reports")
        assert [r["step"] for r in reports] == [16, 17, 18, 19, 20]  # the oldest were dropped
        assert {r["dropped_reports"] for r in reports} == {15}
        assert sdk.progress(21, ctx=ctx)
        assert sdk.flush_progress(10)
        stats = sdk.progress_stats(bus)
        assert stats is not None
        assert (stats.published, stats.dropped, stats.connects) == (6, 15, 1)


def test_with_the_broker_unreachable_calls_return_at_once_and_drops_are_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bus = sdk.BusEndpoint(f"nats://127.0.0.1:{closed_port()}", timeout_s=1, progress_queue=10)
    ctx = ctx_for(bus, "job-down", tmp_path)
    caplog.set_level(logging.WARNING, logger="ckpt_ha.sdk")
    started = time.monotonic()
    for step in range(1, 101):
        sdk.progress(step, ctx=ctx)
    assert time.monotonic() - started < 2.0
    assert (tmp_path / "p").read_text() == "100\n"  # the runner still learns the last step
    stats = sdk.progress_stats(bus)
    assert stats is not None
    assert (stats.queued, stats.dropped, stats.published) == (10, 90, 0)

    def refused() -> bool:
        s = sdk.progress_stats(bus)
        return s is not None and s.connect_failures >= 1

    deadline = time.monotonic() + 10
    while not refused():
        assert time.monotonic() < deadline, "the publisher never tried to connect"
        time.sleep(0.02)
    started = time.monotonic()
    assert sdk.flush_progress(30) is False  # known down: no waiting for it
    assert time.monotonic() - started < 1.0
    lost = [r for r in caplog.records if "not published so far" in r.getMessage()]
    assert len(lost) == 1  # logged at the first drop, not at each of the 90

    pub = publisher.publisher_for(bus)
    publisher.close_all()  # what is still queued at exit counts as dropped
    assert publisher.stats_for(bus) is None
    final = pub.stats()
    assert (final.queued, final.dropped, final.published) == (0, 100, 0)


async def test_reports_queued_before_exit_are_published_at_exit(
    settings: ServiceSettings, producer: Bus, tmp_path: Path
) -> None:
    """A training process that returns right after its last report loses none of them."""
    env = {
        **os.environ,
        protocol.JOB: "job-exit",
        protocol.RUN_ID: "run-1",
        protocol.NATS_URL: settings.nats_url,
        protocol.SUBJECT_PREFIX: settings.subject_prefix,
    }
    script = "from ckpt_ha import sdk\nfor s in range(1, 51):\n    assert sdk.progress(s)\n"
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    reports = await wait_for(lambda: progress_events(settings, 50), what="50 job.progress")
    assert sorted(r["step"] for r in reports) == list(range(1, 51))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
async def test_a_non_finite_metric_is_refused_before_anything_is_written_or_sent(
    settings: ServiceSettings, producer: Bus, tmp_path: Path, bad: float
) -> None:
    """JSON has no NaN: such a report would be dead-lettered by every consumer. It is refused
    in the training process, naming the metric, and nothing of it is written or published."""
    bus = sdk.BusEndpoint(settings.nats_url, prefix=settings.subject_prefix)
    ctx = ctx_for(bus, "job-nan", tmp_path)
    with pytest.raises(ValueError, match=r"metric 'loss' is (nan|inf|-inf): .*finite numbers only"):
        sdk.progress(3, metrics={"acc": 0.5, "loss": bad}, ctx=ctx)
    assert not (tmp_path / "p").exists()
    assert sdk.progress(4, metrics={"acc": 0.5}, ctx=ctx)  # the next good report goes out
    assert sdk.flush_progress(10)
    [report] = await wait_for(lambda: progress_events(settings, 1), what="the good report")
    assert report["step"] == 4
    assert await stream_messages(settings.nats_url, settings.dead_letter_stream) == []
