"""What a dead letter carries besides the original message, written once for the writer
(`ckpt_ha.bus.dead_letter_policy.DeadLetters`) and the readers (``ckpt-ha dead-letters`` and its
replay).

A dead letter is the refused message's own bytes and headers (the job's signature among them)
plus the headers below. Taking those off (and the dead letter's own ``Nats-Msg-Id``) gives back
the message as it was published, which is what a replay re-publishes.
"""

from __future__ import annotations

from collections.abc import Mapping

ERROR_CODE = "Ckpt-Error-Code"
ERROR = "Ckpt-Error"
DELIVERY_COUNT = "Ckpt-Delivery-Count"
CONSUMER = "Ckpt-Consumer"
STREAM_SEQ = "Ckpt-Stream-Seq"
"""The refused message's sequence in the event stream."""
ORIGINAL_SUBJECT = "Ckpt-Original-Subject"
ADDED = (ERROR_CODE, ERROR, DELIVERY_COUNT, CONSUMER, STREAM_SEQ, ORIGINAL_SUBJECT)
"""Headers a dead letter adds to the original's."""

REPLAY_OF = "Ckpt-Replay-Of"
"""On a replay marker: the dead letter's sequence in the dead-letter stream."""
REPLAYED_AS = "Ckpt-Replayed-As"
"""On a replay marker: the replayed message's sequence in the event stream."""
REPLAYED_FROM = "Ckpt-Replayed-From"
"""On a replayed message: ``<dead-letter stream>:<seq>`` it was taken from (for a human)."""

NEVER_REPLAYED = frozenset(
    {"location_not_owned", "job_mismatch", "outside_storage_root", "forged", "unsigned",
     "subject_mismatch"}
)  # fmt: skip
"""Refusals of who may say what (docs/SECURITY.md): the same bytes are refused again by the same
rule, and republishing them is never the fix, so a replay leaves them alone and says so."""


def original_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The refused message's own headers: the dead letter's additions and its dedupe id off."""
    return {k: v for k, v in (headers or {}).items() if k not in ADDED and k != "Nats-Msg-Id"}
