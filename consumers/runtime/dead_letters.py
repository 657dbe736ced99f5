"""A loop's dead letters: emit a record's dead letter through its batch's channel (`runtime.emit`) and wait
until it is durable (Kafka's acknowledgement, or filed for the record's transaction), then count it, report a
bug met on it once per record (`UnexpectedReports`) and say so. Under exactly-once, the dead letter of a
record whose output the broker refused for its size replaces its outputs.
"""

from __future__ import annotations

import logging

from aiokafka import ConsumerRecord
from opentelemetry.trace import Span

from consumers.runtime.containment import UnexpectedReports
from message_history import metrics, tracing
from message_history.errors import error_type
from producers.dead_letters import DeadLetterPublisher
from producers.output import Emit, explain_too_large


class DeadLetters:
    """One path's dead letters. `logger` is the one the lines go to (the loop's: operators filter on it)."""

    def __init__(self, path: str, publisher: DeadLetterPublisher, logger: logging.Logger) -> None:
        self.path = path
        self._publisher = publisher
        self._log = logger
        self._unexpected = UnexpectedReports(path)  # a bug counted once per record, not per attempt

    async def send(self, record: ConsumerRecord, error: BaseException, emit: Emit) -> object:
        """Emit `record`'s dead letter through `emit` and wait until it is durable."""
        with tracing.output_span("dead-letter", record, **{"message_history.path": self.path}) as span:
            return await self._deliver(record, error, span, emit)

    def explain(self, error: BaseException) -> BaseException:
        """An output Kafka refused for its size, as the reason its input is dead-lettered (its bytes fit)."""
        return explain_too_large(error, self.path)

    async def refused_output(self, record: ConsumerRecord, error: BaseException, emit: Emit) -> object:
        """Exactly-once: an output of `record` refused for its size; its dead letter, filed through `emit`,
        replaces its outputs."""
        return await self._deliver(record, explain_too_large(error, self.path), None, emit)

    async def _deliver(
        self, record: ConsumerRecord, error: BaseException, span: Span | None, emit: Emit
    ) -> object:
        # too large for Kafka: without the value, then without the record's own headers too, saying so
        result = await self._publisher.deliver(emit, record, error, span=span)
        kind = error_type(error)
        self._unexpected.report(record, error)
        metrics.DEAD_LETTERS.labels(path=self.path, error_type=kind).inc()
        metrics.OUTCOMES.labels(path=self.path, outcome="dead-letter").inc()
        self._log.warning(
            "dead-lettered a record",
            extra={
                "path": self.path,
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "error_type": kind,
                "dead_letter_topic": self._publisher.topic,
            },
        )
        return result
