"""The wire: round trips for every event type, upcasting, bad input, subjects, committed docs."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from ckpt_ha.cli.asyncapi_gen import main as asyncapi_check
from ckpt_ha.contracts import CATALOG, Envelope, EventCatalog, EventData, build, derive_event_id
from ckpt_ha.contracts.errors import (
    EventTooLarge,
    MalformedEvent,
    UnknownEventType,
    UnsupportedEventVersion,
)
from ckpt_ha.contracts.job import (
    FailureCause,
    FailureCauseV1,
    JobFailedV1,
    JobFailedV2,
    JobFailedV3,
    JobStartedV1,
    JobStartedV2,
)
from ckpt_ha.contracts.resume import (
    ResumeEscalatedV1,
    ResumeEscalatedV2,
    ResumeLoadFailedV1,
    ResumeLoadFailedV2,
    ResumePlannedV1,
    ResumePlannedV2,
)
from ckpt_ha.contracts.schema_gen import main as schema_check
from ckpt_ha.contracts.subjects import event_filter, event_subject, job_from_token, job_token

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)

SAMPLES: dict[str, dict[str, Any]] = {
    "checkpoint.writing": {"checkpoint_id": "c", "uri": "file:///x", "run_id": "r"},
    "checkpoint.committed": {
        "checkpoint_id": "c", "uri": "s3://b/x", "run_id": "r", "step": 1, "format": "torch_dcp",
        "identity": {"job_id": "j", "run_id": "r", "attempt": 2,
                     "topology": {"world_size": 8, "tensor_parallel": 2},
                     "environment": {"framework": "torch", "libraries": {"numpy": "2.0"}}},
    },
    "checkpoint.write_failed": {"checkpoint_id": "c", "uri": "u", "reason": "stalled",
                                "side": "infrastructure"},
    "checkpoint.verified": {"checkpoint_id": "c", "uri": "u", "checks": ["crc32c"]},
    "checkpoint.corrupt": {"checkpoint_id": "c", "uri": "u", "reason": "crc", "side": "job"},
    "checkpoint.registered": {"checkpoint_id": "c", "uri": "u", "step": 3},
    "checkpoint.quarantined": {"checkpoint_id": "c", "uri": "u", "reason": "load failed"},
    "checkpoint.released": {"checkpoint_id": "c", "uri": "u", "reason": "checked", "actor": "a",
                            "quarantine_uri": "file:///q/c"},
    "checkpoint.ownership_transferred": {"from_project": "p", "to_project": "q",
                                         "reason": "reorg", "actor": "a"},
    "checkpoint.conflict": {"checkpoint_id": "c", "uri": "u", "reason": "illegal"},
    "checkpoint.fenced": {"checkpoint_id": "c", "uri": "u", "run_id": "r", "attempt": 1,
                          "fenced_by": 2, "step": 7, "reason": "stale writer"},
    "checkpoint.expired": {"checkpoint_id": "c", "uri": "u", "reason": "age", "policy": "std",
                           "grace_until": "2026-12-01T00:00:00Z"},
    "checkpoint.deleted": {"checkpoint_id": "c", "uri": "u", "reason": "age", "actor": "jan"},
    "checkpoint.pinned": {"checkpoint_id": "c", "uri": "u", "by": "eval:mmlu", "reason": "r",
                          "actor": "a"},
    "checkpoint.unpinned": {"checkpoint_id": "c", "uri": "u", "by": "eval:mmlu", "reason": "r",
                            "actor": "a"},
    "checkpoint.tier_chosen": {"tier": "critical", "reason": "deadline", "actor": "a"},
    "checkpoint.copy_changed": {"checkpoint_id": "c", "uri": "u", "copy_uri": "s3://b/c",
                                "copy_state": "valid", "bytes_copied": 10},
    "job.started": {"run_id": "r", "attempt": 1, "tier": "standard"},
    "job.progress": {"run_id": "r", "step": 10, "metrics": {"loss": 0.5}},
    "job.failed": {"run_id": "r", "cause": "oom", "exit_code": 137, "signal": 9},
    "job.succeeded": {"run_id": "r", "attempt": 2, "last_step": 500},
    "job.heartbeat": {"run_id": "r", "attempt": 2, "sequence": 7, "last_step": 40},
    "job.held": {"actor": "alice", "reason": "storage maintenance"},
    "job.unheld": {"actor": "alice"},
    "job.restore_requested": {"actor": "alice", "reason": "loss spike", "checkpoint_id": "c"},
    "job.stop_requested": {"actor": "alice", "reason": "runaway"},
    "resume.planned": {"plan_id": "p", "failed_run_id": "r", "attempt": 2, "checkpoint_id": "c",
                       "checkpoint_uri": "u", "step": 3, "mode": "exact_resume",
                       "compatibility": "identical"},
    "resume.loaded": {"plan_id": "p", "run_id": "r2", "checkpoint_id": "c", "step": 3},
    "resume.load_failed": {"plan_id": "p", "run_id": "r2", "checkpoint_id": "c",
                           "reason": "crc", "blame": "checkpoint"},
    "resume.verified": {"plan_id": "p", "run_id": "r2", "checkpoint_id": "c", "step": 4,
                        "comparisons": [{"name": "loss", "expected": 0.5, "observed": 0.5,
                                         "ok": True}]},
    "resume.diverged": {"plan_id": "p", "run_id": "r2", "checkpoint_id": "c", "step": 4,
                        "reason": "loss"},
    "resume.escalated": {"plan_id": "p", "reason": "restart loop", "next_step": "runbook 7"},
    "resume.closed": {"plan_id": "p", "cleaned": ["file:///tmp/x"], "unreclaimable": []},
}  # fmt: skip


NEWER = {
    "resume.load_failed": (1, 2), "resume.planned": (1, 2), "resume.escalated": (1, 2),
    "job.started": (1, 2), "job.failed": (1, 2, 3),
}  # fmt: skip
"""Types with more than one version; every other type has only v1."""


def test_catalogue_has_every_type_and_version() -> None:
    assert set(CATALOG.types()) == set(SAMPLES)
    assert all(CATALOG.versions(t) == NEWER.get(t, (1,)) for t in SAMPLES)


@pytest.mark.parametrize(
    ("side", "blame"), [("infrastructure", "attempt"), ("job", "checkpoint"), (None, "checkpoint")]
)
def test_a_v1_load_failure_is_upcast_with_the_blame_v1_consumers_gave_it(
    side: str | None, blame: str
) -> None:
    """v1 had no blame: its consumers quarantined on every load failure except storage ones."""
    data = {"job_id": "j", "plan_id": "p", "run_id": "r", "checkpoint_id": "c", "reason": "x"}
    v1 = ResumeLoadFailedV1.model_validate({**data, **({"side": side} if side else {})})
    decoded = CATALOG.decode(build(v1, source="t", time=NOW, key="k").to_bytes())
    assert isinstance(decoded.data, ResumeLoadFailedV2)
    assert decoded.data.blame.value == blame
    assert decoded.type == "ckpt-ha.resume.load_failed.v2"


def test_v1_plans_and_escalations_are_upcast_and_v2_is_refused_as_v1() -> None:
    """v2 added fields v1 forbids: a v1 plan reads as v2 with them unknown (None), and a v2 body
    published as v1 is refused, not half-read (why it is a new version)."""
    plan = {"job_id": "j", "plan_id": "p", **SAMPLES["resume.planned"]}
    decoded = CATALOG.decode(build(ResumePlannedV1.model_validate(plan), source="t", time=NOW,
                                   key="k").to_bytes())  # fmt: skip
    assert decoded.type == "ckpt-ha.resume.planned.v2"
    assert isinstance(decoded.data, ResumePlannedV2)
    assert (decoded.data.failed_at, decoded.data.fallbacks, decoded.data.policy) == (None,) * 3
    with pytest.raises(ValidationError, match="failed_at"):
        ResumePlannedV1.model_validate({**plan, "failed_at": NOW.isoformat()})
    esc = ResumeEscalatedV1(job_id="j", plan_id="p", reason="r", next_step="n")
    decoded = CATALOG.decode(build(esc, source="t", time=NOW, key="k").to_bytes())
    assert isinstance(decoded.data, ResumeEscalatedV2)
    assert decoded.data.attempt is None


def test_v1_job_starts_and_failures_are_upcast_and_v2_causes_are_refused_as_v1() -> None:
    """A v1 start promised no heartbeat (never declared lost); a v1 failure named no rank or
    reporter; the causes v2 added are not v1 values (a v1 consumer would refuse them)."""
    start = JobStartedV1(job_id="j", run_id="r", attempt=2)
    decoded = CATALOG.decode(build(start, source="t", time=NOW, key="k").to_bytes())
    assert isinstance(decoded.data, JobStartedV2)
    assert (decoded.data.heartbeat_s, decoded.data.deadline_s) == (None, None)
    failed = JobFailedV1(job_id="j", run_id="r", cause=FailureCauseV1.OOM)
    decoded = CATALOG.decode(build(failed, source="t", time=NOW, key="k").to_bytes())
    assert isinstance(decoded.data, JobFailedV2)
    assert (decoded.data.cause, decoded.data.rank, decoded.data.reported_by) == (
        FailureCause.OOM, None, None,
    )  # fmt: skip
    for cause in ("lost", "node_lost", "cancelled"):
        with pytest.raises(ValidationError, match="cause"):
            JobFailedV1.model_validate({"job_id": "j", "run_id": "r", "cause": cause})
        assert JobFailedV2.model_validate({"job_id": "j", "run_id": "r", "cause": cause})


def test_v2_failures_are_upcast_to_v3_and_a_hang_is_refused_as_v2() -> None:
    """v3 added the cause ``hang`` (with the ranks that stopped first and the threshold): a v2
    failure reads as v3 with neither; ``hang`` is no v2 value (a v2 consumer refuses it, which
    is why the runner publishes v3 for a hang only)."""
    failed = JobFailedV2(job_id="j", run_id="r", cause="lost", rank=1)
    decoded = CATALOG.decode(build(failed, source="t", time=NOW, key="k").to_bytes())
    assert isinstance(decoded.data, JobFailedV3)
    assert decoded.data.cause is FailureCause.LOST
    assert (decoded.data.stalled_ranks, decoded.data.hang_after_s) == ((), None)
    assert decoded.type == "ckpt-ha.job.failed.v3"
    with pytest.raises(ValidationError, match="cause"):
        JobFailedV2.model_validate({"job_id": "j", "run_id": "r", "cause": "hang"})
    hang = JobFailedV3(job_id="j", run_id="r", cause="hang", stalled_ranks=(1,), hang_after_s=30)
    again = CATALOG.decode(build(hang, source="t", time=NOW, key="k").to_bytes())
    assert again.data == hang


@pytest.mark.parametrize("event_type", sorted(SAMPLES))
def test_round_trip(event_type: str) -> None:
    model = CATALOG.latest(event_type)
    data = model.model_validate({"job_id": "team.job*>?", **SAMPLES[event_type]})
    event = build(data, source="test", time=NOW, key="k1")
    decoded = CATALOG.decode(event.to_bytes())
    assert decoded == event
    assert decoded.type == f"ckpt-ha.{event_type}.v{NEWER.get(event_type, (1,))[-1]}"
    assert decoded.specversion == "1.0"
    assert decoded.subject == data.subject_key()


def test_event_ids_are_deterministic() -> None:
    data = CATALOG.latest("job.failed").model_validate({"job_id": "j", **SAMPLES["job.failed"]})
    a = build(data, source="x", time=NOW, key="cause-1")
    b = build(data, source="y", time=datetime.now(UTC), key="cause-1")
    c = build(data, source="x", time=NOW, key="cause-2")
    assert a.id == b.id != c.id
    assert a.id == derive_event_id("ckpt-ha.job.failed.v3", "j", "cause-1")


def test_models_are_frozen_and_closed() -> None:
    data = CATALOG.latest("job.started").model_validate({"job_id": "j", "run_id": "r"})
    with pytest.raises(ValidationError):
        data.run_id = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        CATALOG.latest("job.started").model_validate({"job_id": "j", "run_id": "r", "x": 1})


def test_naive_time_is_refused() -> None:
    event = build(
        CATALOG.latest("job.started").model_validate({"job_id": "j", "run_id": "r"}),
        source="t",
        time=NOW,
        key="k",
    )
    doc = json.loads(event.to_bytes())
    doc["time"] = "2026-11-29T10:00:00"
    with pytest.raises(MalformedEvent, match="time"):
        CATALOG.decode(json.dumps(doc).encode())


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"", MalformedEvent),
        (b"{", MalformedEvent),
        (b"\xff\xfe", MalformedEvent),
        (b"[]", MalformedEvent),
        (b'{"data": {}}', MalformedEvent),
        (b'{"type": 7}', MalformedEvent),
        (b'{"type": "ckpt-ha.job.exploded.v1"}', UnknownEventType),
        (b'{"type": "something.else"}', UnknownEventType),
        (b'{"type": "ckpt-ha.job.failed.v9", "data": {}}', UnsupportedEventVersion),
        (b'{"type": "ckpt-ha.job.failed.v1", "data": []}', MalformedEvent),
        (b'{"type": "ckpt-ha.job.failed.v1", "data": {"job_id": "j"}}', MalformedEvent),
        (b"[" * 100_000 + b"]" * 100_000, MalformedEvent),
    ],
)
def test_bad_input_is_a_typed_error(raw: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        CATALOG.decode(raw)


def test_oversized_is_refused_before_parsing() -> None:
    with pytest.raises(EventTooLarge):
        CATALOG.decode(b" " * (CATALOG.max_bytes + 1))


class _OldV1(EventData):
    EVENT_TYPE: ClassVar[str] = "job.renamed"
    EVENT_VERSION: ClassVar[int] = 1
    name: str


class _NewV2(EventData):
    EVENT_TYPE: ClassVar[str] = "job.renamed"
    EVENT_VERSION: ClassVar[int] = 2
    first: str
    last: str


def test_old_versions_are_upcast_to_the_newest() -> None:
    catalog = EventCatalog()
    catalog.register(_OldV1)
    catalog.register(_NewV2)

    @catalog.upcaster("job.renamed", 1)
    def _split(data: dict[str, Any]) -> dict[str, Any]:
        first, _, last = data.pop("name").partition(" ")
        return {**data, "first": first, "last": last}

    old = build(_OldV1(job_id="j", name="Ada Lovelace"), source="t", time=NOW, key="k")
    decoded = catalog.decode(old.to_bytes())
    assert isinstance(decoded.data, _NewV2)
    assert (decoded.data.first, decoded.data.last) == ("Ada", "Lovelace")
    assert decoded.id == old.id
    new = build(_NewV2(job_id="j", first="A", last="B"), source="t", time=NOW, key="k")
    assert catalog.decode(new.to_bytes()) == new


def test_a_version_registered_after_a_decode_is_known_at_once() -> None:
    """The catalogue keeps each type's versions once worked out; registering one more forgets
    them, so a consumer never decodes against a stale list."""
    catalog = EventCatalog()
    catalog.register(_OldV1)
    assert catalog.versions("job.renamed") == (1,)
    catalog.register(_NewV2)
    assert catalog.versions("job.renamed") == (1, 2)
    new = build(_NewV2(job_id="j", first="A", last="B"), source="t", time=NOW, key="k")
    assert catalog.decode(new.to_bytes()) == new


def test_a_decoder_kept_for_a_version_follows_a_newer_one_registered_later() -> None:
    """The catalogue keeps how it decodes every version it met (older ones too); registering
    a newer version forgets them: bytes once decoded as the newest are upcast from then on,
    and a repeated decode gives the same envelope."""
    catalog = EventCatalog()
    catalog.register(_OldV1)
    old = build(_OldV1(job_id="j", name="Ada Lovelace"), source="t", time=NOW, key="k")
    assert catalog.decode(old.to_bytes()) == old
    catalog.register(_NewV2)

    @catalog.upcaster("job.renamed", 1)
    def _split(data: dict[str, Any]) -> dict[str, Any]:
        first, _, last = data.pop("name").partition(" ")
        return {**data, "first": first, "last": last}

    first = catalog.decode(old.to_bytes())
    assert isinstance(first.data, _NewV2)
    assert (first.data.first, first.data.last) == ("Ada", "Lovelace")
    assert catalog.decode(old.to_bytes()) == first
    assert first.type == _NewV2.type_name()


def test_missing_upcaster_is_an_unsupported_version() -> None:
    catalog = EventCatalog()
    catalog.register(_OldV1)
    catalog.register(_NewV2)
    old = build(_OldV1(job_id="j", name="x"), source="t", time=NOW, key="k")
    with pytest.raises(UnsupportedEventVersion):
        catalog.decode(old.to_bytes())


@pytest.mark.parametrize("job", ["job-1", "a.b.c", "x y", "*", ">", "ü/ñ", "~7E"])
def test_job_tokens_are_one_safe_token_and_reversible(job: str) -> None:
    token = job_token(job)
    assert all(c not in token for c in ".*> \t")
    assert job_from_token(token) == job
    subject = event_subject("ckpt", "checkpoint.committed", 1, job)
    assert subject.split(".")[:5] == ["ckpt", "ev", "checkpoint", "committed", "v1"]
    assert len(subject.split(".")) == 6


def test_filters() -> None:
    assert event_filter("p") == "p.ev.>"
    assert event_filter("p", "job.failed") == "p.ev.job.failed.*.*"
    assert event_filter("p", "job.failed", 2) == "p.ev.job.failed.v2.*"


def test_envelope_parametrised_by_payload_type() -> None:
    env_type = Envelope[CATALOG.latest("job.started")]  # type: ignore[misc]
    assert "data" in env_type.model_json_schema()["properties"]


def test_committed_json_schemas_match_the_models() -> None:
    assert schema_check(["--check"]) == 0, "run: python -m ckpt_ha.contracts.schema_gen"


def test_committed_asyncapi_matches_the_service_apps() -> None:
    assert asyncapi_check(["--check"]) == 0, "run: python -m ckpt_ha.cli.asyncapi_gen"
