"""The one place where PyMongo's errors become the service's errors (docs/rules.md#r12).

* Retriable (`StorageUnavailableError`): the server could not be reached or did not answer in time, or it is
  not the primary right now. The same call may succeed later, so the caller backs off and never dead-letters:
  `ConnectionFailure` and its subclasses (`AutoReconnect`, `NetworkTimeout`, `ServerSelectionTimeoutError`,
  `NotPrimaryError`, `WaitQueueTimeoutError`), `ExecutionTimeout`, `WTimeoutError`, any error PyMongo flags as
  a timeout (client-side operation timeouts), any error carrying the `RetryableWriteError` label, and server
  errors whose code is one of the not-primary / shutdown / network / time-limit codes below.
  Of those, an operation that reached the server and did not finish in time (`ExecutionTimeout`,
  `NetworkTimeout`, `WTimeoutError`, server time-limit codes 50 and 262) is an `OperationTimedOutError`: the
  same outage to the batch, but evidence against one record once containment has isolated it
  (`consumers.timeouts`); a server that cannot be reached (refused connection, server selection timeout)
  is not.
* One record's (`DocumentRefusedError`, a dead letter): a write the server refuses for the document alone
  (`RECORD_CODES`: over 16 MiB after the update, a collection validator, a field of the stored row in the
  way): the bulk's other documents are written, the record whose document it is becomes a dead letter.
* Fatal (`FatalStorageError`): everything else PyMongo (or BSON) raises: authentication, authorization, bad
  configuration, an unknown command. Retrying does not help, and it is no record's fault: the loop stops.

The new error's message is short and names the operation, the driver's exception class and the server code;
it never contains the URI or credentials (the driver's own message, which lists hosts, stays on `__cause__`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from bson.errors import BSONError
from pymongo.errors import (
    BulkWriteError,
    ConnectionFailure,
    ExecutionTimeout,
    NetworkTimeout,
    OperationFailure,
    PyMongoError,
    WTimeoutError,
)

from message_history.errors import (
    FatalStorageError,
    MessageHistoryError,
    OperationTimedOutError,
    StorageUnavailableError,
)

__all__ = [
    "RECORD_CODES",
    "RETRIABLE_CODES",
    "is_operation_timeout",
    "is_retriable",
    "record_errors",
    "storage_errors",
    "to_storage_error",
]

# Server error codes that mean "not now" rather than "never" (the drivers' retryable-error list, plus time
# limits): HostUnreachable, HostNotFound, NetworkTimeout, ShutdownInProgress, PrimarySteppedDown,
# ExceededTimeLimit, SocketException, NotWritablePrimary, InterruptedAtShutdown,
# InterruptedDueToReplStateChange, NotPrimaryNoSecondaryOk, NotPrimaryOrSecondary, MaxTimeMSExpired,
# WriteConcernFailed (w timeout), FailedToSatisfyReadPreference, ReadConcernMajorityNotAvailableYet,
# LegacyNotPrimary.
RETRIABLE_CODES: frozenset[int] = frozenset(
    {6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436, 50, 64, 133, 134, 10058}
)


# Write errors that are one document's, not the deployment's: BadValue, TypeMismatch, PathNotViable (a `$set`
# of `metadata.x` into a row whose `metadata` is not an object), DocumentValidationFailure (a collection
# validator), BSONObjectTooLarge, KeyTooLong, a document over 16 MiB after the update, an update path whose
# parent is not a document. Another document of the same bulk is written; this one never will be.
RECORD_CODES: frozenset[int] = frozenset({2, 14, 28, 121, 10334, 16837, 17280, 17419})


def reply_int(value: object, default: int) -> int:
    """An integer of a server's reply (a code, an index, a count); anything else reads as `default`. A reply
    is an input too: a malformed one must not raise out of the code that reads why a write failed."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def reply_entries(details: object, key: str) -> list[Mapping[str, Any]]:
    """The documents of a bulk reply's list `key` (`writeErrors`, `writeConcernErrors`, `upserted`); a value
    that is not a list, and an entry that is not a document, read as none."""
    entries = details.get(key) if isinstance(details, Mapping) else None
    if not isinstance(entries, list):
        return []
    return [entry for entry in entries if isinstance(entry, Mapping)]


def reply_codes(details: object, key: str = "writeErrors") -> list[int]:
    """The codes of a bulk reply's `key` entries (0 where one is missing or not an integer)."""
    return [reply_int(entry.get("code"), 0) for entry in reply_entries(details, key)]


def record_errors(exc: BaseException) -> dict[int, str] | None:
    """The bulk's refused operations, by index, with why, when every write error of `exc` is one document's
    (`RECORD_CODES`) and nothing else failed (no write concern error); else None."""
    if not isinstance(exc, BulkWriteError):
        return None
    write, concern = _bulk_codes(exc.details)
    if concern or not write or not all(code in RECORD_CODES for code in write):
        return None
    refused: dict[int, str] = {}
    for error in reply_entries(exc.details, "writeErrors"):
        code = reply_int(error.get("code"), 0)
        name = error.get("codeName")
        name = name if isinstance(name, str) else ""
        refused[reply_int(error.get("index"), -1)] = (
            f"MongoDB refused the document: code {code} {name}".rstrip()
        )
    return refused


def _bulk_codes(details: object) -> tuple[list[int], list[int]]:
    return reply_codes(details, "writeErrors"), reply_codes(details, "writeConcernErrors")


def is_retriable(exc: BaseException) -> bool:
    """True when `exc` (from PyMongo) reports an outage, a timeout or a not-primary condition."""
    if isinstance(exc, ConnectionFailure | ExecutionTimeout | WTimeoutError):
        return True
    if not isinstance(exc, PyMongoError):
        return False
    if _driver_timeout(exc) or exc.has_error_label("RetryableWriteError"):
        return True
    if isinstance(exc, BulkWriteError):
        write, concern = _bulk_codes(exc.details)
        if any(code in RETRIABLE_CODES for code in concern):
            return True
        return bool(write) and all(code in RETRIABLE_CODES for code in write)
    return isinstance(exc, OperationFailure) and exc.code in RETRIABLE_CODES


def _driver_timeout(exc: PyMongoError) -> bool:
    """PyMongo's own `timeout` of `exc`; False where its property cannot read the details (a bulk reply
    whose error lists hold something else than documents: it indexes and `.get`s them unguarded)."""
    try:
        return bool(exc.timeout)
    except (AttributeError, TypeError, KeyError, IndexError):
        return False


# MaxTimeMSExpired, ExceededTimeLimit: the server ran the operation and stopped it at its time limit
_TIME_LIMIT_CODES: frozenset[int] = frozenset({50, 262})


def is_operation_timeout(exc: BaseException) -> bool:
    """True when `exc` (from PyMongo) is an operation that reached the server and did not finish in time;
    False for a server that cannot be reached at all (a refused connection, a server selection timeout) and
    for everything else."""
    if isinstance(exc, ExecutionTimeout | NetworkTimeout | WTimeoutError):
        return True
    if isinstance(exc, BulkWriteError):
        write, _ = _bulk_codes(exc.details)
        return bool(write) and all(code in _TIME_LIMIT_CODES for code in write)
    return isinstance(exc, OperationFailure) and exc.code in _TIME_LIMIT_CODES


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    if isinstance(exc, BulkWriteError):
        write, concern = _bulk_codes(exc.details)
        return f"{name} (write error codes {sorted(set(write))}, write concern codes {sorted(set(concern))})"
    if isinstance(exc, OperationFailure) and exc.code is not None:
        code_name = (exc.details or {}).get("codeName")
        return f"{name} code {exc.code}" + (f" {code_name}" if code_name else "")
    return name


def to_storage_error(exc: BaseException, operation: str) -> MessageHistoryError:
    """The service error for a driver error raised by `operation` (a short verb phrase)."""
    if is_retriable(exc):
        if is_operation_timeout(exc):
            return OperationTimedOutError(f"MongoDB timed out during {operation}: {_describe(exc)}")
        return StorageUnavailableError(f"MongoDB unavailable during {operation}: {_describe(exc)}")
    return FatalStorageError(f"MongoDB refused {operation}: {_describe(exc)}")


@contextmanager
def storage_errors(operation: str) -> Iterator[None]:
    """Map PyMongo / BSON errors raised in the block to `StorageUnavailableError` / `FatalStorageError`."""
    try:
        yield
    except (PyMongoError, BSONError) as exc:
        raise to_storage_error(exc, operation) from exc
