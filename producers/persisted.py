"""`agent.history.persisted`: a `HistoryPersisted` per response, keyed by thread, response headers kept."""

from __future__ import annotations

import asyncio
from typing import Any

from producers.output import Emit, Headers, Positioned, TopicPublisher
from schemas.codec import encode
from schemas.events import HistoryPersisted


class PersistedPublisher(TopicPublisher):
    """Sends persist outcomes; the key is the thread id so a thread stays on one partition."""

    async def publish(
        self, emit: Emit, record: Positioned, event: HistoryPersisted, *, headers: Headers
    ) -> asyncio.Future[Any]:
        """Emit the event for `record`; the future resolves once it is durable."""
        return await self._send(emit, record, event.threadId.encode(), encode(event), headers)

    async def publish_value(
        self, emit: Emit, record: Positioned, thread_id: str, value: bytes, *, headers: Headers
    ) -> asyncio.Future[Any]:
        """Emit an outcome already encoded (`schemas.codec.persisted_value`) for a turn of `thread_id`."""
        return await self._send(emit, record, thread_id.encode(), value, headers)
