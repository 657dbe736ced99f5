"""`agent.history.persisted`: a `HistoryPersisted` per response, keyed by thread, response headers kept."""

from __future__ import annotations

import asyncio
from typing import Any

from producers.output import Headers, OutputProducer
from schemas.events import HistoryPersisted, encode


class PersistedPublisher:
    """Sends persist outcomes; the key is the thread id so a thread stays on one partition."""

    def __init__(self, producer: OutputProducer, topic: str) -> None:
        self._producer = producer
        self.topic = topic

    async def publish(self, event: HistoryPersisted, *, headers: Headers) -> asyncio.Future[Any]:
        """Buffer the event; the future resolves when Kafka acknowledged it."""
        return await self._producer.send(
            self.topic, key=event.threadId.encode(), value=encode(event), headers=headers
        )
