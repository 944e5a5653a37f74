"""Which durables provisioning made obsolete: a filter that no subject of its stream can match
(`ckpt_ha.bus.obsolete.overlap`, NATS wildcards ``*`` and ``>``)."""

from __future__ import annotations

import pytest

from ckpt_ha.bus.obsolete import overlap


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("ckpt.ev.job.heartbeat.*.*", "ckpt.ev.>", True),
        ("ckpt.ev.job.heartbeat.*.*", "ckpt.ev.job.started.*.*", False),
        ("ckpt.ev.job.heartbeat.*.*", "ckpt.ev.job.*.*.*", True),
        ("ckpt.ev.job.heartbeat.*.*", "ckpt.ev.job.heartbeat.>", True),
        ("ckpt.ev.job.heartbeat.a.b", "ckpt.ev.job.heartbeat.*", False),
        ("ckpt.ev.>", "ckpt.ev", False),
        ("ckpt.ev.>", "ckpt.ev.x", True),
        ("ckpt.dlq.>", "ckpt.ev.>", False),
        ("a.*", "*.b", True),
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
    ],
)
def test_overlap(a: str, b: str, expected: bool) -> None:
    assert overlap(a, b) is expected
    assert overlap(b, a) is expected
