"""`agent.memory.observe`: Observational Memory's work for observer workers (`ObserveRequest`,
`ReflectRequest`), keyed by the record's subject (the thread, or the resource with resource scope)."""

from __future__ import annotations

import asyncio
from typing import Any

from producers.output import Emit, Headers, Positioned, TopicPublisher
from schemas.codec import encode
from schemas.observational import ObserveRequest, ReflectRequest


class ObservePublisher(TopicPublisher):
    """Sends observation and reflection work; one thread's (resource's) work stays on one partition."""

    async def publish(
        self,
        emit: Emit,
        record: Positioned,
        event: ObserveRequest | ReflectRequest,
        *,
        headers: Headers = (),
    ) -> asyncio.Future[Any]:
        """`record`'s work event, through `emit`; the future resolves when it is durable."""
        key = event.threadId if event.scope == "thread" and event.threadId else event.resourceId
        return await self._send(emit, record, key.encode(), encode(event), headers)
