"""Why an operation could not be carried out. Each error builds its one-line message from its
typed fields; the message says what to do next. The CLI prints it and exits with the code its
``exit`` names (`ckpt_ha.cli.errors.Exit`)."""

from __future__ import annotations

from typing import ClassVar, Literal


class OperationFailed(Exception):
    """An operation that did not happen (or did not finish); nothing to retry blindly."""

    exit: ClassVar[Literal["NO", "UNREACHABLE", "FAILED"]] = "FAILED"
    """What the CLI exits with: a lookup that found nothing is a negative answer (``NO``), a
    storage that failed under the operation ``UNREACHABLE``, anything else ``FAILED``."""


class CheckpointNotFound(OperationFailed):
    exit = "NO"

    def __init__(self, checkpoint_id: str) -> None:
        self.checkpoint_id = checkpoint_id
        super().__init__(f"no checkpoint {checkpoint_id!r} in the registry")


class NotRecorded(OperationFailed):
    """An operator event was published, but the registrar has not projected it in time."""

    def __init__(
        self, what: str, waited_s: float, advice: str = "", event_id: str | None = None
    ) -> None:
        self.waited_s = waited_s
        self.event_id = event_id
        message = f"published, but the registrar has not recorded {what} within {waited_s:g} s"
        message += f" ({advice})" if advice else ""
        super().__init__(f"{message}; event {event_id}" if event_id is not None else message)


class RegistryNotEmpty(OperationFailed):
    def __init__(self) -> None:
        super().__init__(
            "the registry is not empty; stop the registrar and pass --clear to replace it with "
            "a rebuild from the event stream"
        )


class StreamIncomplete(OperationFailed):
    """The event stream lost its first events; a rebuild would silently forget checkpoints."""


class RebuildWithoutSigningKey(OperationFailed):
    """A rebuild without the deployment's job-signing key would refuse every job-signed event
    as forged (`checkpoint.committed` among them) and rebuild a registry without them."""

    def __init__(self) -> None:
        super().__init__(
            "no job-signing key: a rebuild would refuse every job-signed event as forged and "
            "lose their checkpoints; set CKPT_HA_SIGNING_KEY_FILE (or CKPT_HA_SIGNING_KEY) to "
            "the deployment's master key, as the services have it"
        )


class StreamReplaced(StreamIncomplete):
    """The event stream is not the one the registry was built from: deleted and created again
    (it starts at sequence 1 like the original, but the original's history is gone)."""

    def __init__(self, recorded: str, current: str) -> None:
        self.recorded = recorded
        self.current = current
        super().__init__(
            f"the registry was built from stream {recorded}, but the stream now is {current}: "
            "it was deleted and created again, so its history is gone and a rebuild would "
            "forget every checkpoint it held; restore the stream from a backup first (or, when "
            "the new stream is meant to start afresh, rebuild with --accept-new-stream)"
        )


class NothingToAudit(OperationFailed):
    exit = "NO"

    def __init__(self, checkpoint_id: str) -> None:
        self.checkpoint_id = checkpoint_id
        super().__init__(f"nothing to audit for checkpoint {checkpoint_id!r}")


class NothingToMeasure(OperationFailed):
    exit = "NO"

    def __init__(self, job_id: str, why: str) -> None:
        self.job_id = job_id
        self.why = why
        super().__init__(why)


class ListingFailed(OperationFailed):
    """The store could not be listed: nothing was deleted (a partial listing is never read as
    "absent")."""

    exit = "UNREACHABLE"

    def __init__(self, error: Exception, where: str | None = None) -> None:
        self.error = error
        self.where = where
        """The replica root that could not be listed (None: the storage root)."""
        super().__init__(f"listing the store failed, nothing done: {error}")


class DeletionFailed(OperationFailed):
    exit = "UNREACHABLE"

    def __init__(self, deleted: int, error: Exception) -> None:
        self.deleted = deleted
        self.error = error
        super().__init__(f"deleted {deleted} object(s), then storage failed: {error}")


class NotSettled(OperationFailed):
    def __init__(self, checkpoint_id: str, waited_s: float) -> None:
        self.checkpoint_id = checkpoint_id
        super().__init__(f"checkpoint {checkpoint_id} was not verified within {waited_s:g} s")
