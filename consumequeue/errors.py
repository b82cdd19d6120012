# Owns the typed errors of the consume-queue layer (ConsumeQueue, IndexFile,
# dispatcher, rebuild).  They derive from CommitLogError so the mqadmin and
# broker boundaries translate them in the same one place as store errors.
import attrs

from commitlog.errors import CommitLogError


class ConsumeQueueError(CommitLogError):
    """Base of every error the consume-queue layer raises on purpose."""


@attrs.define(str=False)
class BadTopicError(ConsumeQueueError):
    """A topic that cannot name a consumequeue/<topic>/ directory."""

    topic: str

    def __str__(self) -> str:
        return f"topic {self.topic!r} cannot be a consume queue directory name"


@attrs.define(str=False)
class DispatchError(ConsumeQueueError):
    """The committed commitlog range cannot be dispatched (structural damage
    the store should have caught, or a committed position inside an entry)."""

    position: int
    reason: str

    def __str__(self) -> str:
        return f"cannot dispatch commitlog at position {self.position}: {self.reason}"


@attrs.define(str=False)
class InconsistentStateError(ConsumeQueueError):
    """Consume queues / index files that disagree with the dispatch
    checkpoint; the remedy is a rebuild."""

    reason: str

    def __str__(self) -> str:
        return f"consume queues are inconsistent with the dispatch checkpoint: {self.reason}"


@attrs.define(str=False)
class MessageNotFoundError(ConsumeQueueError):
    """No readable, committed message record starts at this commitlog
    position (VIEW_MESSAGE_BY_ID answers SYSTEM_ERROR with this text)."""

    position: int
    reason: str

    def __str__(self) -> str:
        return f"no message at commitlog position {self.position}: {self.reason}"
