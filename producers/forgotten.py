"""The forgotten topic: one `HistoryForgotten` per forget command, keyed like the command."""

from __future__ import annotations

import asyncio
from typing import Any

from producers.output import Headers, TopicPublisher
from schemas.commands import HistoryForgotten, encode_answer


class ForgottenPublisher(TopicPublisher):
    """Sends the answers to forget commands; the key is the command's (thread or resource id)."""

    async def publish(self, event: HistoryForgotten, *, key: bytes, headers: Headers) -> asyncio.Future[Any]:
        """Buffer the answer; the future resolves when Kafka acknowledged it."""
        return await self._send(key, encode_answer(event), headers)
