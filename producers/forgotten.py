"""The forgotten topic: one `HistoryForgotten` per forget command, keyed like the command."""

from __future__ import annotations

import asyncio
from typing import Any

from producers.output import Emit, Headers, Positioned, TopicPublisher
from schemas.commands import HistoryForgotten, encode_answer


class ForgottenPublisher(TopicPublisher):
    """Sends the answers to forget commands; the key is the command's (thread or resource id)."""

    async def publish(
        self, emit: Emit, record: Positioned, event: HistoryForgotten, *, key: bytes, headers: Headers
    ) -> asyncio.Future[Any]:
        """Emit the answer to the command `record`; the future resolves once it is durable."""
        return await self._send(emit, record, key, encode_answer(event), headers)
