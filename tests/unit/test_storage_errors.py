"""Driver errors map to the service's errors in one place: outages and timeouts retriable, the rest fatal."""

from __future__ import annotations

import pytest
from bson.int64 import Int64
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ConfigurationError,
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
    WTimeoutError,
)

from message_history.errors import FatalStorageError, OperationTimedOutError, StorageUnavailableError
from storage.errors import (
    RECORD_CODES,
    RETRIABLE_CODES,
    is_operation_timeout,
    is_retriable,
    record_errors,
    reply_codes,
    reply_entries,
    reply_int,
    storage_errors,
    to_storage_error,
)


def _labelled(label: str) -> PyMongoError:
    exc = OperationFailure("labelled", code=2)
    exc._add_error_label(label)
    return exc


CASES: list[tuple[str, BaseException, bool]] = [
    ("auto-reconnect", AutoReconnect("127.0.0.1:27017: connection closed"), True),
    ("network-timeout", NetworkTimeout("timed out"), True),
    ("server-selection", ServerSelectionTimeoutError("No servers found"), True),
    ("connection-failure", ConnectionFailure("refused"), True),
    ("not-primary", NotPrimaryError("not primary", {"code": 10107}), True),
    ("execution-timeout", ExecutionTimeout("operation exceeded time limit", code=50), True),
    ("w-timeout", WTimeoutError("waiting for replication timed out", code=64), True),
    ("retryable-write-label", _labelled("RetryableWriteError"), True),
    ("primary-stepped-down-code", OperationFailure("stepped down", code=189), True),
    ("shutdown-code", OperationFailure("shutting down", code=91), True),
    (
        "bulk-write-concern-timeout",
        BulkWriteError({"writeErrors": [], "writeConcernErrors": [{"code": 64, "errmsg": "wtimeout"}]}),
        True,
    ),
    ("auth-failed", OperationFailure("Authentication failed.", code=18), False),
    ("unauthorized", OperationFailure("not authorized", code=13), False),
    ("no-such-command", OperationFailure("no such command", code=59), False),
    ("duplicate-key", DuplicateKeyError("E11000", code=11000), False),
    (
        "bulk-duplicate-key",
        BulkWriteError({"writeErrors": [{"code": 11000, "errmsg": "E11000"}], "writeConcernErrors": []}),
        False,
    ),
    ("configuration", ConfigurationError("bad uri"), False),
    ("not-a-driver-error", ValueError("x"), False),
]


@pytest.mark.parametrize(("exc", "retriable"), [(e, r) for _, e, r in CASES], ids=[i for i, _, _ in CASES])
def test_retriable_classification(exc: BaseException, retriable: bool) -> None:
    """Each driver error is classified retriable (outage, timeout, not primary) or not."""
    assert is_retriable(exc) is retriable


@pytest.mark.parametrize(
    ("exc", "retriable"), [(e, r) for _, e, r in CASES[:-1]], ids=[i for i, _, _ in CASES[:-1]]
)
def test_mapped_type_and_short_message(exc: BaseException, retriable: bool) -> None:
    """The mapped error is StorageUnavailableError or FatalStorageError; it names the operation, no host."""
    mapped = to_storage_error(exc, "list_messages")
    assert isinstance(mapped, StorageUnavailableError if retriable else FatalStorageError)
    assert mapped.retriable is retriable
    assert "list_messages" in str(mapped)
    assert type(exc).__name__ in str(mapped)
    assert "127.0.0.1" not in str(mapped)


def test_context_manager_chains_the_driver_error() -> None:
    """`storage_errors` raises the mapped error from the driver's, and lets other exceptions through."""
    with pytest.raises(StorageUnavailableError) as caught, storage_errors("ping"):
        raise AutoReconnect("gone")
    assert isinstance(caught.value.__cause__, AutoReconnect)
    with pytest.raises(KeyError), storage_errors("ping"):
        raise KeyError("not a driver error")


TIMEOUTS: list[tuple[str, BaseException, bool]] = [
    ("network-timeout-server-reached", NetworkTimeout("timed out"), True),
    ("execution-timeout", ExecutionTimeout("operation exceeded time limit", code=50), True),
    ("w-timeout", WTimeoutError("waiting for replication timed out", code=64), True),
    ("max-time-ms-code", OperationFailure("time limit", code=50), True),
    ("exceeded-time-limit-code", OperationFailure("time limit", code=262), True),
    (
        "bulk-time-limit",
        BulkWriteError({"writeErrors": [{"code": 50, "errmsg": "time limit"}], "writeConcernErrors": []}),
        True,
    ),
    ("server-selection-is-unreachable", ServerSelectionTimeoutError("No servers found"), False),
    ("refused-is-unreachable", AutoReconnect("connection refused"), False),
    ("connection-failure", ConnectionFailure("refused"), False),
    ("not-primary", NotPrimaryError("not primary", {"code": 10107}), False),
    ("auth-failed", OperationFailure("Authentication failed.", code=18), False),
]


@pytest.mark.parametrize(
    ("exc", "timeout"), [(e, t) for _, e, t in TIMEOUTS], ids=[i for i, _, _ in TIMEOUTS]
)
def test_an_operation_timeout_is_told_from_an_unreachable_server(exc: BaseException, timeout: bool) -> None:
    """An operation that reached the server and ran out of time is `OperationTimedOutError` (still an outage
    to the batch); a server that cannot be reached is a plain `StorageUnavailableError`."""
    assert is_operation_timeout(exc) is timeout
    mapped = to_storage_error(exc, "list_messages")
    assert isinstance(mapped, OperationTimedOutError) is timeout
    if timeout:
        assert isinstance(mapped, StorageUnavailableError)
        assert mapped.retriable


def _bulk(*codes: int, concern: int | None = None, upserted: int | None = None) -> BulkWriteError:
    details: dict[str, object] = {
        "writeErrors": [{"index": n, "code": code, "codeName": f"C{code}"} for n, code in enumerate(codes)],
        "writeConcernErrors": [] if concern is None else [{"code": concern}],
    }
    if upserted is not None:
        details["upserted"] = [{"index": upserted, "_id": "x"}]
    return BulkWriteError(details)


RECORD_CASES: list[tuple[str, BaseException, dict[int, str] | None]] = [
    ("over 16 MiB after the update", _bulk(17419), {0: "MongoDB refused the document: code 17419 C17419"}),
    ("a collection validator", _bulk(121), {0: "MongoDB refused the document: code 121 C121"}),
    ("BSONObjectTooLarge", _bulk(10334), {0: "MongoDB refused the document: code 10334 C10334"}),
    ("metadata not an object", _bulk(28), {0: "MongoDB refused the document: code 28 C28"}),
    ("two documents, each its own", _bulk(121, 17419),
     {0: "MongoDB refused the document: code 121 C121",
      1: "MongoDB refused the document: code 17419 C17419"}),
    ("one document's and a duplicate key: not all the record's", _bulk(121, 11000), None),
    ("one document's and a write concern error", _bulk(121, concern=64), None),
    ("unauthorized", _bulk(13), None),
    ("not a bulk error", OperationFailure("refused", code=121), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("exc", "refused"), [(e, r) for _, e, r in RECORD_CASES], ids=[i for i, _, _ in RECORD_CASES]
)
def test_a_documents_own_refusal_is_the_records(exc: BaseException, refused: dict[int, str] | None) -> None:
    """Write errors of one document each (17419, 121, 10334, ...) are the records' (their dead letters); the
    old classification alone made every one of them FatalStorageError, which stops the loop (issue 31)."""
    assert record_errors(exc) == refused
    if refused is not None:
        assert isinstance(to_storage_error(exc, "save messages"), FatalStorageError)  # the path not taken now


def test_record_codes_are_no_outage_nor_authorization() -> None:
    assert not RECORD_CODES & RETRIABLE_CODES
    assert not RECORD_CODES & {13, 18, 8000, 11000}


# A bulk reply is an input too: a MongoDB-wire server (or a driver's merge of its replies) may put anything
# where a code, an index or a list belongs. Reading it must classify the error, never raise: `int()` of a
# code "x" raised ValueError out of the write's error handling (a crash, not a retriable or fatal error).
MALFORMED: list[tuple[str, dict[str, object], dict[int, str] | None]] = [
    ("code-a-string", {"writeErrors": [{"index": 0, "code": "x"}]}, None),
    ("code-none", {"writeErrors": [{"index": 0, "code": None}]}, None),
    ("code-a-float", {"writeErrors": [{"index": 0, "code": 121.0}]}, None),
    ("code-a-bool", {"writeErrors": [{"index": 0, "code": True}]}, None),
    ("index-a-string", {"writeErrors": [{"index": "a", "code": 121}]},
     {-1: "MongoDB refused the document: code 121"}),
    ("code-name-not-a-string", {"writeErrors": [{"index": 0, "code": 121, "codeName": 5}]},
     {0: "MongoDB refused the document: code 121"}),
    ("errors-not-a-list", {"writeErrors": "oops"}, None),
    ("entries-not-documents", {"writeErrors": [5, None, "x"]}, None),
    ("concern-code-a-string",
     {"writeErrors": [{"index": 0, "code": 121}], "writeConcernErrors": [{"code": "64"}]}, None),
    ("concern-not-a-list", {"writeErrors": [{"index": 0, "code": 121}], "writeConcernErrors": 7},
     {0: "MongoDB refused the document: code 121"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("details", "refused"), [(d, r) for _, d, r in MALFORMED], ids=[i for i, _, _ in MALFORMED]
)
def test_a_malformed_bulk_reply_is_classified_never_raises(
    details: dict[str, object], refused: dict[int, str] | None
) -> None:
    exc = BulkWriteError(details)  # what a hostile reply holds
    assert record_errors(exc) == refused
    assert not is_retriable(exc)  # no code of an outage: the storage's fatal error, the loop's to handle
    assert not is_operation_timeout(exc)
    assert isinstance(to_storage_error(exc, "save messages"), FatalStorageError)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(121, 121), (Int64(11000), 11000), ("121", -1), (None, -1), (1.0, -1), (True, -1), ([1], -1)],
)
def test_reply_int_takes_integers_only(value: object, expected: int) -> None:
    assert reply_int(value, -1) == expected


def test_reply_entries_and_codes() -> None:
    details = {"writeErrors": [{"code": 11000}, 5, {"code": "x"}, {}], "upserted": "no"}
    assert reply_entries(details, "writeErrors") == [{"code": 11000}, {"code": "x"}, {}]
    assert reply_codes(details) == [11000, 0, 0]
    assert reply_entries(details, "upserted") == []
    assert reply_entries("not a reply", "writeErrors") == []
