"""A lease in MongoDB: at most one holder at a time for a named job, expiring so a dead holder blocks nobody.

`message_history_leases` (beside Mastra's collections; Mastra never reads it) holds one document per job:

    {_id: "<job>", holder: "<replica id>", expiresAt: Date, renewedAt: Date}

Taking (or renewing) it is one atomic conditional update, an upsert whose filter matches only when the
lease is free: `{_id: job, $or: [{holder: me}, {expiresAt: {$lte: now}}]}`. When another replica holds an
unexpired lease the filter matches nothing and the upsert's insert of a second `_id` fails with a duplicate
key: not taken. When the document does not exist yet, two replicas racing to insert it are settled the same
way. The times are the replicas' clocks: keep them in sync (NTP) to well under the lease's length; a skew only
lets two replicas hold it in the same interval, which for an idempotent job costs work, not correctness.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from pymongo.errors import DuplicateKeyError

from storage.client import CODEC
from storage.errors import storage_errors

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

log = logging.getLogger(__name__)

LEASES: Final = "message_history_leases"


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds (or last held) a lease and until when; `MongoLease.current` reads it."""

    holder: str
    expires_at: datetime


class MongoLease:
    """The lease `job` as seen by `holder`; each `acquire` holds it for `ttl` from then."""

    def __init__(self, db: AsyncDatabase[Any], job: str, *, holder: str, ttl: timedelta) -> None:
        if ttl <= timedelta(0):
            raise ValueError("a lease's ttl must be more than zero")
        self.collection: AsyncCollection[dict[str, Any]] = db.get_collection(LEASES, codec_options=CODEC)
        self.job = job
        self.holder = holder
        self.ttl = ttl

    async def acquire(self, *, now: datetime | None = None) -> bool:
        """Take the lease, or renew it when this holder has it; False while another holds it unexpired."""
        now = now or datetime.now(UTC)
        free = {"_id": self.job, "$or": [{"holder": self.holder}, {"expiresAt": {"$lte": now}}]}
        taken = {"$set": {"holder": self.holder, "expiresAt": now + self.ttl, "renewedAt": now}}
        with storage_errors(f"take the {self.job!r} lease"):
            try:
                await self.collection.update_one(free, taken, upsert=True)
            except DuplicateKeyError:
                return False  # held by another: the filter matched nothing, the insert met its _id
        return True

    async def current(self) -> LeaseHolder | None:
        """Who holds the lease, or last held it when `expires_at` is past (for a log line; not part of taking
        it); None when nobody ever took it."""
        with storage_errors(f"read the {self.job!r} lease"):
            doc = await self.collection.find_one({"_id": self.job})
        if doc is None or not isinstance(doc.get("expiresAt"), datetime):
            return None
        return LeaseHolder(str(doc.get("holder")), doc["expiresAt"])
