"""A bulk of update statements sent as one `update` command, without the driver's per-operation objects.

PyMongo's `bulk_write` builds an `UpdateOne` per statement, validates it, copies it into its bulk's own
operation document and merges the reply in Python: about 2.3 us of this process's CPU a statement, of the
persist path's ~4 a turn (issue 33: a median of 6.8-7.1 -> 4.4-4.9 us a statement, `python -m bench
update-command`; docs/benchmarks.md, "the bulk writes as one update command"). The statements
here are already in the wire shape (`{"q", "u", "upsert"}`), so they go out as the command's `updates` as
they are, and the reply is read only where it says something went wrong.

What stays the driver's: a command the driver would refuse for its size (`DocumentTooLarge`, raised before
anything is sent), a bulk estimated large (`set_strings`, or the caller's `approx_bytes`) and one of more
statements than a server takes in one command (`LEAN_STATEMENTS`) go through `bulk_write` instead, which
splits them. Write errors come back as the `BulkWriteError` `bulk_write` raises (indexes, codes, the failed
statement as `op`, `upserted`), so the callers' handling is one. Not kept: the driver's one retry of a
retryable write after a network error. Use this only for statements a retried batch may run again:
idempotent ones (an upsert, `$set`, `$max`), or ones whose rerun is harmless (the busy markers' `answered`
list then holds a request id twice, which only a membership test reads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from pymongo import UpdateOne
from pymongo.errors import BulkWriteError, DocumentTooLarge
from pymongo.results import BulkWriteResult

from storage.errors import reply_entries, reply_int

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

__all__ = ["LEAN_BYTES", "LEAN_STATEMENTS", "Statement", "as_operation", "set_strings", "update_statements"]

Statement = dict[str, Any]
"""One update statement as the `update` command takes it: `{"q": filter, "u": update, "upsert": bool}`."""

# A bulk the caller puts above this goes through `bulk_write` at once: a command body may hold 16 MiB, and
# encoding a larger one only to have the driver refuse it would cost a second encoding per batch.
LEAN_BYTES: Final = 8 * 1024 * 1024

# More statements than this go through `bulk_write`, which splits them by the server's `maxWriteBatchSize`
# (100,000 on MongoDB): a server refuses a larger `update` command whole, and a batch of many tiny messages
# (up to 500 records of 2,000 each) could otherwise fail on every retry. A persist batch writes ~1,500.
LEAN_STATEMENTS: Final = 10_000


def as_operation(statement: Mapping[str, Any]) -> UpdateOne:
    """The `UpdateOne` of a statement (for `bulk_write`)."""
    return UpdateOne(statement["q"], statement["u"], upsert=bool(statement.get("upsert", False)))


async def update_statements(
    collection: AsyncCollection[Any],
    statements: Sequence[Statement],
    *,
    ordered: bool,
    approx_bytes: int | None = None,
) -> BulkWriteResult:
    """The statements written as `collection.bulk_write` of their `UpdateOne`s would write them, with its
    result and its `BulkWriteError`; in one `update` command when they fit one (`approx_bytes`: their size
    as the caller knows it; by default `set_strings`)."""
    if not statements:
        raise ValueError("no update statements to write")
    if len(statements) > LEAN_STATEMENTS:
        return await _driver_bulk(collection, statements, ordered=ordered)
    if approx_bytes is None:
        approx_bytes = set_strings(statements)
    if approx_bytes <= LEAN_BYTES:
        command: dict[str, Any] = {"update": collection.name, "updates": statements, "ordered": ordered}
        concern = collection.write_concern
        if not concern.is_server_default:
            command["writeConcern"] = concern.document
        try:
            reply = await collection.database.command(command)
        except DocumentTooLarge:
            pass  # refused before it was sent: the driver's bulk splits it
        else:
            return bulk_result(reply, statements, acknowledged=concern.acknowledged)
    return await _driver_bulk(collection, statements, ordered=ordered)


async def _driver_bulk(
    collection: AsyncCollection[Any], statements: Sequence[Statement], *, ordered: bool
) -> BulkWriteResult:
    return await collection.bulk_write([as_operation(s) for s in statements], ordered=ordered)


def set_strings(statements: Sequence[Statement]) -> int:
    """The length of the strings the statements `$set` at their top level (a message's content and extra
    fields: what makes a bulk large). Cheap and an underestimate for other shapes (nested values, multi-byte
    text), which the driver's `DocumentTooLarge` still routes to its bulk."""
    total = 0
    for statement in statements:
        update = statement["u"]
        fields = update.get("$set") if isinstance(update, dict) else None
        if isinstance(fields, dict):
            total += sum(len(v) for v in fields.values() if isinstance(v, str))
    return total


def bulk_result(
    reply: Mapping[str, Any], statements: Sequence[Statement], *, acknowledged: bool
) -> BulkWriteResult:
    """An `update` command's reply as `bulk_write` reports it: its `BulkWriteResult`, or the
    `BulkWriteError` it raises when a statement failed or the write concern did (PyMongo's
    `bulk_shared._merge_command` and `_raise_bulk_write_error`, for one command)."""
    affected = reply_int(reply.get("n"), 0)
    upserted = [{**u, "index": reply_int(u.get("index"), -1)} for u in reply_entries(reply, "upserted")]
    full: dict[str, Any] = {
        "writeErrors": [],
        "writeConcernErrors": [],
        "nInserted": 0,
        "nUpserted": len(upserted),
        "nMatched": affected - len(upserted),
        "nModified": reply_int(reply.get("nModified"), 0),
        "nRemoved": 0,
        "upserted": upserted,
    }
    for error in reply_entries(reply, "writeErrors"):
        entry = dict(error)
        index = entry["index"] = reply_int(entry.get("index"), -1)
        entry["code"] = reply_int(entry.get("code"), 0)
        if 0 <= index < len(statements):
            entry["op"] = statements[index]
        full["writeErrors"].append(entry)
    concern = reply.get("writeConcernError")
    if concern:
        full["writeConcernErrors"].append(
            dict(concern) if isinstance(concern, Mapping) else {"errmsg": concern}
        )
    if full["writeErrors"] or full["writeConcernErrors"]:
        full["writeErrors"].sort(key=lambda e: e["index"])
        raise BulkWriteError(full)
    return BulkWriteResult(full, acknowledged)
