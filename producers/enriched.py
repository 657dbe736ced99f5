"""`agent.requests.enriched`: an `EnrichedRequest` per request, keyed by thread, request headers kept."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from producers.output import Emit, Headers, Positioned, TopicPublisher
from schemas.codec import encode
from schemas.events import EnrichedRequest


class EnrichedPublisher(TopicPublisher):
    """Sends enriched requests; the key is the thread id so a thread stays on one partition."""

    sends_encoded: ClassVar[bool] = True
    """The recall path may hand over the event's bytes (`publish_encoded`: recalled rows spliced, no models);
    a publisher that does more with the event object says False and gets `publish(EnrichedRequest)`."""

    async def publish(
        self, emit: Emit, record: Positioned, event: EnrichedRequest, *, headers: Headers
    ) -> asyncio.Future[Any]:
        """Emit the event for `record`; the future resolves once it is durable."""
        return await self.publish_encoded(emit, record, event.threadId, encode(event), headers=headers)

    async def publish_encoded(
        self, emit: Emit, record: Positioned, thread_id: str, value: bytes, *, headers: Headers
    ) -> asyncio.Future[Any]:
        """`publish` for an event already encoded (`schemas.recalled.encode_enriched`)."""
        return await self._send(emit, record, thread_id.encode(), value, headers)
