"""`agent.history.persisted`: a `HistoryPersisted` per response, keyed by thread, response headers kept."""

from __future__ import annotations

import asyncio
from typing import Any

from producers.output import Headers, TopicPublisher
from schemas.codec import encode
from schemas.events import HistoryPersisted


class PersistedPublisher(TopicPublisher):
    """Sends persist outcomes; the key is the thread id so a thread stays on one partition."""

    async def publish(self, event: HistoryPersisted, *, headers: Headers) -> asyncio.Future[Any]:
        """Buffer the event; the future resolves when Kafka acknowledged it."""
        return await self._send(event.threadId.encode(), encode(event), headers)

    async def publish_value(self, thread_id: str, value: bytes, *, headers: Headers) -> asyncio.Future[Any]:
        """Buffer an outcome already encoded (`schemas.codec.persisted_value`) for a turn of `thread_id`."""
        return await self._send(thread_id.encode(), value, headers)
