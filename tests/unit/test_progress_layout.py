"""Where telemetry goes: the subjects of the event and the progress stream, routing by subject,
and what a service checks of each stream (pure: no server)."""

from __future__ import annotations

import dataclasses

from ckpt_ha.bus import streams
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.stream_reader import overlaps
from ckpt_ha.contracts import CATALOG
from ckpt_ha.contracts.subjects import (
    TELEMETRY,
    event_subject,
    is_telemetry,
    record_filters,
    telemetry_filters,
)


def test_the_event_stream_captures_every_event_type_but_telemetry() -> None:
    records = record_filters("p", CATALOG.types())
    reports = telemetry_filters("p")
    for event_type in CATALOG.types():
        for version in CATALOG.versions(event_type):
            subject = event_subject("p", event_type, version, "job.7")
            in_records = any(overlaps(subject, f) for f in records)
            in_reports = any(overlaps(subject, f) for f in reports)
            assert (in_records, in_reports) == (
                event_type not in TELEMETRY,
                event_type in TELEMETRY,
            ), subject
            assert is_telemetry("p", subject) is (event_type in TELEMETRY)
    # No two streams may capture one subject (JetStream refuses it).
    assert not any(overlaps(a, b) for a in records for b in reports)


def test_subject_filters_overlap_token_by_token() -> None:
    assert overlaps("p.ev.>", "p.ev.job.progress.*.*")
    assert overlaps("p.ev.*.*.*.j1", "p.ev.job.progress.*.*")
    assert not overlaps("p.ev.resume.>", "p.ev.job.progress.*.*")
    assert not overlaps("p.ev.job.started.*.*", "p.ev.job.progress.*.*")
    assert not overlaps("p.ev.job.progress.*", "p.ev.job.progress.*.*")


def test_each_subject_is_published_to_its_stream() -> None:
    cfg = BusConfig(prefix="p")
    assert cfg.stream_of("p.ev.job.progress.v1.j") == "CKPT_PROGRESS"
    assert cfg.stream_of("p.ev.job.heartbeat.v1.j") == "CKPT_PROGRESS"
    assert cfg.stream_of("p.ev.job.started.v2.j") == "CKPT_EVENTS"
    assert cfg.stream_of("q.ev.job.progress.v1.j") == "CKPT_EVENTS"  # another prefix's
    assert cfg.stream_of("p.dlq.registrar.checkpoints") == "CKPT_DLQ"
    legacy = BusConfig(prefix="p", progress_stream="")
    assert legacy.stream_of("p.ev.job.progress.v1.j") == "CKPT_EVENTS"
    assert [s.name for s in streams.desired(legacy)] == ["CKPT_EVENTS", "CKPT_DLQ"]
    assert streams.desired(legacy)[0].subjects == ["p.ev.>"]


def test_the_event_stream_gives_up_telemetry_before_the_progress_stream_takes_it() -> None:
    names = [s.name for s in streams.desired(BusConfig())]
    assert names.index("CKPT_EVENTS") < names.index("CKPT_PROGRESS")


def test_a_legacy_event_stream_is_refused_a_wider_one_accepted() -> None:
    cfg = BusConfig(prefix="p")
    want = streams.desired(cfg)[0]
    legacy = streams.desired(dataclasses.replace(cfg, progress_stream=""))[0]
    [problem] = streams.differences(want, legacy)
    assert problem.startswith("subjects are ['p.ev.>'], need ")
    wider = dataclasses.replace(want, subjects=[*(want.subjects or []), "p.ev.future.>"])
    assert streams.differences(want, wider) == []


def test_a_service_checks_the_progress_streams_protections_not_its_limits() -> None:
    want = streams.desired(BusConfig())[2]
    assert (want.max_age, want.max_msgs_per_subject) == (86400.0, 100)
    tuned = dataclasses.replace(want, max_age=3600.0, max_msgs_per_subject=10, max_bytes=1)
    assert streams.differences(want, tuned, limits=False) == []  # a service's check
    assert len(streams.differences(want, tuned)) == 3  # provisioning sets them
    unprotected = dataclasses.replace(want, deny_purge=False)
    assert streams.differences(want, unprotected, limits=False) == [
        "deny_purge is False, needs True"
    ]


def test_the_event_stream_keeps_no_limits() -> None:
    events = streams.desired(BusConfig())[0]
    unlimited = (events.max_age, events.max_bytes, events.max_msgs_per_subject)
    assert unlimited == (0, -1, -1)
    limited = dataclasses.replace(events, max_age=60.0)
    assert streams.differences(events, limited) == ["max_age is 60.0, needs 0"]
