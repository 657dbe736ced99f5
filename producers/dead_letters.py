"""Dead-letter topics: the refused record's key and value bytes untouched, the reason in headers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, Protocol

from opentelemetry.trace import Span

from message_history import __version__
from message_history.errors import MessageHistoryError, error_type
from message_history.tracing import output_headers
from producers.output import OUTPUT_TOO_LARGE, Emit
from schemas.dead_letters import dead_letter_headers


class ValueOmittedError(MessageHistoryError):
    """The reason of a dead letter sent without its value, which is over Kafka's record size limit."""

    def __init__(self, error: BaseException, size: int, *, headers_too: bool = False) -> None:
        self.original_type = error_type(error)
        what = f"the value ({size} bytes)" + (" and the record's own headers are" if headers_too else " is")
        super().__init__(
            f"[{what} omitted from this dead letter: it is over Kafka's record size "
            f"limit; the record is still in the source topic at source.partition/source.offset] {error}"
        )

    @property
    def error_type(self) -> str:
        return self.original_type


class SourceRecord(Protocol):
    """What a dead letter needs of the consumed record (aiokafka's `ConsumerRecord` has it)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any  # a sequence of (str, bytes)


class DeadLetterPublisher:
    """Sends one path's refused records to its dead-letter topic, through the `Emit` channel of the record's
    batch (it holds no producer)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    async def publish(
        self,
        emit: Emit,
        record: SourceRecord,
        error: BaseException,
        *,
        span: Span | None = None,
        omit_value: bool = False,
        omit_headers: bool = False,
    ) -> asyncio.Future[Any]:
        """Emit the dead letter for `record`; the future resolves once it is durable.

        With a `span`, the dead letter carries its trace context instead of the record's (one `traceparent`).
        `omit_value` sends it with an empty value (for a record too large to be sent again), saying so;
        `omit_headers` (with `omit_value`) leaves out the record's own headers too, for a record whose headers
        alone, with ours, are over the limit.
        """
        if omit_value:
            error = ValueOmittedError(error, len(record.value or b""), headers_too=omit_headers)
        headers = dead_letter_headers(
            error=error,
            source_topic=record.topic,
            source_partition=record.partition,
            source_offset=record.offset,
            failed_at=datetime.now(UTC),
            service_version=__version__,
            original_headers=output_headers(
                [] if omit_headers else [(k, v or b"") for k, v in (record.headers or ())], span
            ),
        )
        value = b"" if omit_value else record.value
        if value is None and record.key is None:
            value = b""  # a record with neither key nor value cannot be produced as is; empty is the closest
        return await emit(record, self.topic, key=record.key, value=value, headers=headers, alone=True)

    async def deliver(
        self, emit: Emit, record: SourceRecord, error: BaseException, *, span: Span | None = None
    ) -> Any:
        """`publish` and wait for Kafka's acknowledgement. A dead letter over Kafka's record size limit goes
        again without the value (a record as large as the limit allows), then without the record's own
        headers too (hostile headers near the limit), each time saying so: a record is never left without its
        dead letter, which would stop the loop."""
        try:
            return await (await self.publish(emit, record, error, span=span))
        except OUTPUT_TOO_LARGE:
            pass
        try:
            return await (await self.publish(emit, record, error, span=span, omit_value=True))
        except OUTPUT_TOO_LARGE:
            return await (
                await self.publish(emit, record, error, span=span, omit_value=True, omit_headers=True)
            )
