"""One root for every error the service raises, with the retry decision on the error itself.

    MessageHistoryError                 retriable = False
    ├── InvalidInputError (ValueError)  bad input: a dead letter, never retried
    │   ├── EventValidationError        not JSON, not the schema, over a limit; carries the field path
    │   ├── ThreadOwnershipError        the event's resourceId is not the stored thread's owner
    │   │   └── MessageIdTakenError     a message id of the turn is already another thread's
    │   ├── DocumentTooLargeError       a message would be a MongoDB document over its 16 MiB limit
    │   ├── DocumentRefusedError        MongoDB refused one record's document (17419, 121, 10334, ...)
    │   ├── UnreadableRowError          a stored row no Mastra would read, which the record cannot skip
    │   ├── OutputTooLargeError         the output of a record is over Kafka's record size limit
    │   ├── ThreadBusyError             busy-thread policy `reject`: an earlier turn is not answered yet
    │   └── UnexpectedRecordError       a bug met on one record (any other exception): dead-lettered too
    ├── AbortError                      a processor step called abort(reason): the turn stops, nothing written
    ├── RetriableError                  retriable = True: an outage; back off, pause intake, never dead-letter
    │   ├── StorageUnavailableError     MongoDB unreachable, timed out, not primary
    │   ├── BarrierUnavailableError     the turn barrier's offset look-up failed (Kafka)
    │   └── WaitInterruptedError        stopping while a turn waited: left for the partition's next owner
    ├── FatalStorageError               MongoDB refused the operation for good (auth, authorization, config)
    └── StartupError                    the service cannot start as configured (e.g. HTTP port in use)

`error_type` is what goes into a dead letter's `error.type` header.
"""

from __future__ import annotations


class MessageHistoryError(Exception):
    """Root of every error raised by message-history."""

    retriable: bool = False

    @property
    def error_type(self) -> str:
        return type(self).__name__


class InvalidInputError(MessageHistoryError, ValueError):
    """Input that can never succeed: it goes to the dead-letter topic and the stream moves on."""


class EventValidationError(InvalidInputError):
    """An event that is not JSON, breaks the schema, or exceeds a limit.

    `path` is the dotted field path (empty for the whole record); `reason` is short and free of secrets.
    """

    def __init__(self, reason: str, path: str = "") -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}" if path else reason)


class ThreadOwnershipError(InvalidInputError):
    """The event names a thread that belongs to another resourceId; nothing is recalled or written."""

    def __init__(self, thread_id: str, resource_id: str, owner: str) -> None:
        self.thread_id = thread_id
        self.resource_id = resource_id
        self.owner = owner
        self.message_id: str | None = None
        # The message becomes a dead letter's header: it names only the thread the sender sent, never the
        # owner nor anything else of theirs.
        super().__init__(f"thread {thread_id!r} is owned by another resource")


class MessageIdTakenError(ThreadOwnershipError):
    """A message id of the turn is stored in another thread (or saved by another thread earlier in the batch):
    the turn is refused, nothing of it is written. The reason names only the caller's own thread and id.

    A subclass of `ThreadOwnershipError` so that every path refusing a turn for ownership refuses it for this.
    """

    def __init__(self, thread_id: str, resource_id: str, message_id: str) -> None:
        self.thread_id = thread_id
        self.resource_id = resource_id
        self.owner = ""  # never told: it may be another tenant
        self.message_id = message_id
        InvalidInputError.__init__(
            self,
            f"message id {message_id!r} is already used in another thread; a message id must be unique "
            f"across all threads (give messages UUIDs, or leave `id` out); turn for thread {thread_id!r} "
            "refused",
        )


class DocumentTooLargeError(InvalidInputError):
    """A message of the event would be a MongoDB document larger than MongoDB accepts; nothing is written."""


class DocumentRefusedError(InvalidInputError):
    """MongoDB refused a write for this record's document alone (over 16 MiB after the update, a collection
    validator, ...): the record is a dead letter, the rest of its batch is written. Never retried: the same
    document is refused again."""


class UnreadableRowError(InvalidInputError):
    """A stored row (of `collection`) that no Mastra would read: skipped and counted where recall can leave it
    out; a dead letter (this error) where the record cannot go on without it (the turn's own stored copy).

    `reason` is a short class (`bson`, `role`, `content`, `id`, `createdAt`, `type`, ...) kept for metrics;
    `detail` says what is wrong. The message names the collection, the row and the thread.
    """

    def __init__(self, collection: str, row_id: object, thread_id: object, reason: str, detail: str) -> None:
        self.collection = collection
        self.row_id = row_id
        self.thread_id = thread_id
        self.reason = reason
        self.detail = detail
        super().__init__(
            f"stored row {row_id!r} of thread {thread_id!r} in {collection} cannot be read: {detail}"
        )


class OutputTooLargeError(InvalidInputError):
    """Kafka refused the record's output for its size; `error_type` stays the Kafka error's name."""

    def __init__(self, reason: str, kafka_error: str) -> None:
        self.kafka_error = kafka_error
        super().__init__(reason)

    @property
    def error_type(self) -> str:
        return self.kafka_error


class ThreadBusyError(InvalidInputError):
    """Busy-thread policy `reject`: the thread has a turn enriched and not answered; the request is refused.

    Not malformed input, but the same route: the request goes to the dead-letter topic untouched (so the
    client can send it again), with this error's type and a message naming the pending turn.
    """

    def __init__(self, thread_id: str, pending_request_id: str) -> None:
        self.thread_id = thread_id
        self.pending_request_id = pending_request_id
        super().__init__(
            f"thread-busy: thread {thread_id!r} has turn {pending_request_id!r} enriched and not answered yet"
        )


class UnexpectedRecordError(InvalidInputError):
    """Any exception met on one record that is neither bad input we name nor an outage: a bug, contained.

    The record is dead-lettered like bad input, so one record never stops the stream; `error_type` is the
    original exception's class and the message is its message. `cause` keeps the exception (and its
    traceback) for the ERROR log line; `stage` says where it was met (decode, process, output, batch).
    """

    def __init__(self, cause: BaseException, stage: str) -> None:
        self.cause = cause
        self.stage = stage
        super().__init__(str(cause) or type(cause).__name__)

    @property
    def error_type(self) -> str:
        return error_type(self.cause)


class AbortError(MessageHistoryError):
    """Raised by `abort(reason)` inside a processor step: the turn stops and writes nothing."""

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason or "aborted"
        super().__init__(self.reason)


class RetriableError(MessageHistoryError):
    """A dependency is unavailable; the same operation may succeed later."""

    retriable = True


class StorageUnavailableError(RetriableError):
    """MongoDB could not be reached or did not answer in time."""


class BarrierUnavailableError(RetriableError):
    """The turn barrier could not read the responses topic's end or committed offsets (Kafka down or slow)."""


class WaitInterruptedError(RetriableError):
    """Stopping while a request waits for its turn: it is left for the partition's next owner."""


class FatalStorageError(MessageHistoryError):
    """MongoDB refused an operation in a way that retrying will not fix and that is no record's fault:
    authentication, authorization, configuration (a bad index, an unknown command). Stops the loop."""


class StartupError(MessageHistoryError):
    """The service cannot start as configured (e.g. the HTTP port is already in use); fix the settings."""


def error_type(error: BaseException) -> str:
    """The one name of an error in dead letters, metrics and spans: ours say it, others are their class."""
    return error.error_type if isinstance(error, MessageHistoryError) else type(error).__name__
