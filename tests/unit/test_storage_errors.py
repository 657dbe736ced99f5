"""Driver errors map to the service's errors in one place: outages and timeouts retriable, the rest fatal."""

from __future__ import annotations

import pytest
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

from message_history.errors import FatalStorageError, StorageUnavailableError
from storage.errors import (
    RECORD_CODES,
    RETRIABLE_CODES,
    is_retriable,
    record_errors,
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
