"""The observed messages' places for Observational Memory's `lastObservedMessageCursor` (issue 35;
docs/observational-memory.md#thread-hints): one `find` on `mastra_messages`, projected on `id`, `thread_id`
and `createdAt`.

The answer names the observed ids; the rows give their dates, so a cursor never points past what the
thread holds. The filter keeps the answer's threads and its resource (a row without a `resourceId`, as
resource scope's read takes it, is its thread's): a row of another owner never leaves the server. A row
whose projected fields do not read (the id or the date as a whole row's read refuses them: the same
`schemas.stored_rows.row_header`) is skipped and counted (`storage.unreadable`), never raised; its content
is not read, so a row readable but for its content still gives its place.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Final

from pymongo.asynchronous.database import AsyncDatabase

from message_history.core.observation_hints import StoredStamp
from message_history.errors import UnreadableRowError
from schemas.stored_rows import MESSAGES, row_header
from storage.errors import storage_errors
from storage.raw_rows import RAW, decode_row
from storage.unreadable import skip

__all__ = ["STAMP_PROJECTION", "observed_stamps"]

STAMP_PROJECTION: Final = {"_id": 0, "id": 1, "thread_id": 1, "createdAt": 1}


async def observed_stamps(
    db: AsyncDatabase[Any], message_ids: Sequence[str], thread_ids: Collection[str], resource_id: str
) -> list[StoredStamp]:
    """The stored places of `message_ids` in `thread_ids` owned by `resource_id` (in no particular order)."""
    ids = list(dict.fromkeys(message_ids))
    threads = list(dict.fromkeys(thread_ids))
    if not ids or not threads:
        return []
    query: dict[str, Any] = {
        "id": {"$in": ids},
        "thread_id": threads[0] if len(threads) == 1 else {"$in": threads},
        "resourceId": {"$in": [resource_id, None]},  # None: null or missing
    }
    rows = db.get_collection(MESSAGES, codec_options=RAW)
    with storage_errors("om message stamps"):
        raws = await rows.find(query, STAMP_PROJECTION).batch_size(len(ids) + 1).to_list()
    stamps: list[StoredStamp] = []
    for raw in raws:
        try:
            doc = decode_row(raw.raw, MESSAGES)
            ident, _, created = row_header(doc)
        except UnreadableRowError as exc:
            skip(exc)
            continue
        # as the `Message` model keeps it: milliseconds (a legacy ISO string may hold more)
        created = created.replace(microsecond=created.microsecond // 1000 * 1000)
        stamps.append(StoredStamp(ident, str(doc.get("thread_id")), created))
    return stamps
