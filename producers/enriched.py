"""`agent.requests.enriched`: an `EnrichedRequest` per request, keyed by thread, request headers kept."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from producers.output import Headers, TopicPublisher
from schemas.codec import encode
from schemas.events import EnrichedRequest


class EnrichedPublisher(TopicPublisher):
    """Sends enriched requests; the key is the thread id so a thread stays on one partition."""

    sends_encoded: ClassVar[bool] = True
    """The recall path may hand over the event's bytes (`publish_encoded`: recalled rows spliced, no models);
    a publisher that does more with the event object says False and gets `publish(EnrichedRequest)`."""

    async def publish(self, event: EnrichedRequest, *, headers: Headers) -> asyncio.Future[Any]:
        """Buffer the event; the future resolves when Kafka acknowledged it."""
        return await self.publish_encoded(event.threadId, encode(event), headers=headers)

    async def publish_encoded(self, thread_id: str, value: bytes, *, headers: Headers) -> asyncio.Future[Any]:
        """`publish` for an event already encoded (`schemas.recalled.encode_enriched`)."""
        return await self._send(thread_id.encode(), value, headers)
