"""The two kinds of processing failure; they decide ack vs nak.

`PermanentError`: the same message will fail the same way again (bad payload, illegal transition);
it is dead-lettered at once. `TransientError`: the world may change (broker, Redis or storage
outage; an event that arrived before the one it depends on); it is nak'ed with backoff until
`max_deliver`, whose last attempt dead-letters.
"""

from __future__ import annotations


class PermanentError(Exception):
    code = "permanent"


class TransientError(Exception):
    code = "transient"


class DependencyNotReady(TransientError):
    """An event refers to something this consumer has not seen yet (delivery order)."""

    code = "not_ready"

    def __init__(self, what: str, needed: str, *, in_stream: bool = True) -> None:
        self.what = what
        self.needed = needed
        self.in_stream = in_stream
        """True when what is needed is an earlier event, or its effect: a consumer that died
        holding it gives it back only after ``ack_wait``, so the bus waits as long as that can
        take before dead-lettering (`ckpt_ha.bus.delivery.nak_delay`). False for a wait with a
        deadline of its own (the coordinator's grace for a pending verification): the plain
        back-off."""
        super().__init__(f"{what} needs {needed}, which has not arrived yet")
