"""`storage.update_command.bulk_result`: an `update` command's reply read as `bulk_write` reports it."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import BulkWriteError

from storage.update_command import Statement, bulk_result, set_strings

STATEMENTS: list[Statement] = [{"q": {"_id": n}, "u": {"$set": {"n": n}}, "upsert": True} for n in range(3)]


@pytest.mark.parametrize(
    ("reply", "upserted", "matched", "modified"),
    [
        (
            {"ok": 1, "n": 3, "nModified": 0, "upserted": [{"index": i, "_id": i} for i in range(3)]},
            [0, 1, 2],
            0,
            0,
        ),
        ({"ok": 1, "n": 3, "nModified": 2}, [], 3, 2),
        ({"ok": 1, "n": 2, "nModified": 1, "upserted": [{"index": 2, "_id": 2}]}, [2], 1, 1),
        ({"ok": 1}, [], 0, 0),  # an unacknowledged-looking reply: nothing counted
    ],
)
def test_a_reply_without_errors_is_the_result(
    reply: dict[str, Any], upserted: list[int], matched: int, modified: int
) -> None:
    result = bulk_result(reply, STATEMENTS, acknowledged=True)
    assert sorted(result.upserted_ids or {}) == upserted
    assert (result.upserted_count, result.matched_count, result.modified_count) == (
        len(upserted),
        matched,
        modified,
    )
    assert result.inserted_count == 0


def test_write_errors_are_the_bulk_write_error_sorted_with_their_statements() -> None:
    reply = {
        "ok": 1,
        "n": 1,
        "nModified": 0,
        "upserted": [{"index": 0, "_id": 0}],
        "writeErrors": [
            {"index": 2, "code": 121, "errmsg": "validation"},
            {"index": 1, "code": 11000, "errmsg": "dup"},
        ],
    }
    with pytest.raises(BulkWriteError) as caught:
        bulk_result(reply, STATEMENTS, acknowledged=True)
    details = caught.value.details
    assert [(e["index"], e["code"]) for e in details["writeErrors"]] == [(1, 11000), (2, 121)]
    assert [e["op"] for e in details["writeErrors"]] == [STATEMENTS[1], STATEMENTS[2]]
    assert details["upserted"] == [{"index": 0, "_id": 0}]
    assert details["writeConcernErrors"] == []
    assert reply["writeErrors"] == [
        {"index": 2, "code": 121, "errmsg": "validation"},
        {"index": 1, "code": 11000, "errmsg": "dup"},
    ]  # the reply untouched


def test_a_write_concern_error_alone_is_a_bulk_write_error() -> None:
    reply = {"ok": 1, "n": 3, "nModified": 3, "writeConcernError": {"code": 64, "errmsg": "waiting"}}
    with pytest.raises(BulkWriteError) as caught:
        bulk_result(reply, STATEMENTS, acknowledged=True)
    assert caught.value.details["writeConcernErrors"] == [{"code": 64, "errmsg": "waiting"}]
    assert caught.value.details["writeErrors"] == []


def test_an_error_index_outside_the_bulk_carries_no_statement() -> None:
    reply = {"ok": 1, "n": 0, "nModified": 0, "writeErrors": [{"index": 7, "code": 2, "errmsg": "odd"}]}
    with pytest.raises(BulkWriteError) as caught:
        bulk_result(reply, STATEMENTS, acknowledged=True)
    assert "op" not in caught.value.details["writeErrors"][0]


@pytest.mark.parametrize(
    "reply",
    [
        {"ok": 1, "n": "3", "nModified": None, "upserted": "all of them"},
        {"ok": 1, "n": True, "nModified": 2.5, "upserted": [1, "x", None]},
        {"ok": 1, "n": 2, "nModified": 0, "upserted": {"index": 0}},
    ],
)
def test_a_malformed_reply_without_errors_reads_as_nothing_counted(reply: dict[str, Any]) -> None:
    """A reply is an input too: counts or arrays of the wrong type read as none, never a `TypeError` out
    of the write (the callers catch PyMongo's errors only)."""
    result = bulk_result(reply, STATEMENTS, acknowledged=True)
    assert result.upserted_ids == {}
    assert result.modified_count == 0


def test_malformed_write_errors_are_still_a_bulk_write_error() -> None:
    reply = {
        "ok": 1,
        "writeErrors": [
            {"index": "2", "code": 11000},
            "not a document",
            {"code": "121"},
            {"index": 1, "code": 2},
        ],
        "writeConcernError": "waiting",
    }
    with pytest.raises(BulkWriteError) as caught:
        bulk_result(reply, STATEMENTS, acknowledged=True)
    details = caught.value.details
    assert [(e["index"], e["code"]) for e in details["writeErrors"]] == [(-1, 11000), (-1, 0), (1, 2)]
    assert ["op" in e for e in details["writeErrors"]] == [False, False, True]
    assert details["writeConcernErrors"] == [{"errmsg": "waiting"}]


@pytest.mark.parametrize(
    ("statements", "expected"),
    [
        ([], 0),
        ([{"q": {}, "u": {"$set": {"id": "ab", "content": "xyz", "n": 7, "d": {"s": "nested"}}}}], 5),
        ([{"q": {}, "u": [{"$set": {"a": "long" * 100}}]}], 0),  # a pipeline: not counted
        ([{"q": {}, "u": {"$setOnInsert": {"a": "bc"}}}, {"q": {}, "u": {"$set": "odd"}}], 0),
        ([{"q": {}, "u": {"$set": {"a": "é" * 4}}}] * 3, 12),  # characters, not bytes
    ],
)
def test_set_strings_counts_the_top_level_set_strings(statements: list[Statement], expected: int) -> None:
    assert set_strings(statements) == expected


def test_a_malformed_upserted_index_reads_as_none() -> None:
    reply = {"ok": 1, "n": 1, "upserted": [{"index": "0", "_id": "a"}]}
    assert bulk_result(reply, STATEMENTS, acknowledged=True).upserted_ids == {-1: "a"}
