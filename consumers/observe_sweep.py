"""The observed path's sweep of stale claims: observation (reflection) work sent again for a thread whose
observer never answered, without waiting for the thread to speak again (issue 35;
docs/observational-memory.md).

A claim is taken again by its thread's next saved turn once older than `OBSERVATION_TIMEOUT_S`
(`consumers.observe_emit`); a thread that goes quiet would keep its flag until then. So, every
`OBSERVATION_TIMEOUT_S / 2`, while the observed path runs, the sweep reads the rows whose claim the service
made before `now - OBSERVATION_TIMEOUT_S` and still holds (one page of at most `SWEEP_PAGE` rows, oldest claim
first, on the `_mh_claimed_at` index: `storage.observational.MongoObservationalStore.stale_claims`) and for
each:

* the row is no longer its key's newest generation: the old generation's flag is cleared (nobody reads it);
  its flag already cleared by another writer (a Mastra app): the claim time left behind is dropped;
* reflection (`isReflecting`): the claim is taken again (cycle + 1, the same conditional write as the
  persist path's) and a `ReflectRequest` with the whole log sent;
* observation (`isObserving`): the thread's unobserved messages since `lastObservedAt` are read (the newest
  `MAX_ROWS_PER_REQUEST`), the claim taken again and an `ObserveRequest` sent; none left (forgotten, pruned):
  the claim is released.

Several replicas may sweep at once: the claim is a conditional write on the row's cycle, so one takes it and
the others skip the row. A flag set by a Mastra app (no `_mh_claimed_at`) is not swept: the service does not
know that thread's settings until one of its turns comes (the persist path then takes it over as before).

**Sending.** The sweep's work is the output of no consumed record (no offset to commit with it), so it is a
plain send, not a transaction, in both processing guarantees: in exactly-once mode on a producer of its own
(idempotent, `acks=all`, never transactional; `read_committed` observers see it at once). That is safe because
the claim is written before the send and results apply by claim: an answer applies only while its `(recordId,
generation, cycle)` is the row's current claim. A send lost (the service dies after the claim) leaves a claim
that ages and is swept again; a work sent twice gets two answers, of which one applies.

The thresholds of a re-sent observation are those the row was made with (its `config`, Mastra's option
shape), over the service's defaults. The `requestId` is the claim's (`_mh_claimed_by`, kept), so the turn that
made the claim, redelivered, still sends its work again at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from consumers.observational import observation_defaults
from consumers.observe_work import (
    ResourceRows,
    observe_request,
    observed_state,
    reflect_request,
    resource_unobserved,
    since_observed,
    work_fields,
)
from consumers.runtime.containment import containable
from consumers.runtime.emit import SendNow
from message_history import metrics
from message_history.core.observation import (
    ObservationSettings,
    dynamic_threshold,
    resolve_settings,
    unobserved_messages,
)
from message_history.core.observation_resource import oldest_first
from message_history.core.om_tokens import count_om_messages
from message_history.errors import MessageHistoryError
from message_history.settings import Settings
from producers.observe import ObservePublisher
from producers.output import OutputProducer
from schemas.observational import ObserveRequest, ReflectRequest
from storage.observational import Claim, Kind, ObservationalRecord
from storage.protocol import BatchHistoryStorage

__all__ = ["SWEEP_PAGE", "ObservationSweep", "SendWork", "SweepRows", "observation_sweep", "sweeping"]

log = logging.getLogger(__name__)

SWEEP_PAGE: Final = 100
"""Stale claims handled per round at most (the oldest first); more wait for the next round."""

SendWork = Callable[[ObserveRequest | ReflectRequest], Awaitable["asyncio.Future[Any]"]]
"""Hands one work event to Kafka; the future resolves once Kafka has it (`ObservePublisher.publish`)."""


class SweepRows(ResourceRows, Protocol):
    """The part of `storage.observational.MongoObservationalStore` the sweep uses."""

    async def stale_claims(self, cutoff: datetime, limit: int) -> list[ObservationalRecord]: ...

    async def get(self, thread_id: str | None, resource_id: str) -> ObservationalRecord | None: ...

    async def claim(
        self, record: ObservationalRecord, kind: Kind, now: datetime, *, by: str | None = None
    ) -> Claim | None: ...

    async def release(self, claim: Claim, now: datetime) -> bool: ...

    async def drop_claim_time(self, record_id: str, cycle: int) -> bool: ...


@dataclass(slots=True, eq=False)
class ObservationSweep:
    """One round at a time (`round`); `run` repeats it every half timeout. See the module docstring."""

    settings: Settings
    rows: SweepRows
    storage: BatchHistoryStorage
    send: SendWork
    page: int = field(default=SWEEP_PAGE, kw_only=True)

    @property
    def interval_s(self) -> float:
        return self.settings.observation_timeout_s / 2

    async def run(self) -> None:
        """Sweep every `interval_s` until cancelled; a failed round is logged (an outage as a warning,
        anything else with its traceback) and the next round tries again: it never stops the service."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.round()
            except MessageHistoryError as exc:
                log.warning("observation sweep failed", extra={"error": str(exc), "retriable": exc.retriable})
            except Exception:
                log.exception("observation sweep failed")

    async def round(self, now: datetime | None = None) -> int:
        """One sweep: the stale claims' work sent again (released when there is none); how many were sent.
        Returns once Kafka has every work sent."""
        now = now or datetime.now(UTC)
        timeout = timedelta(seconds=self.settings.observation_timeout_s)
        stale = await self.rows.stale_claims(now - timeout, self.page)
        sent: list[asyncio.Future[Any]] = []
        for record in stale:
            future = await self._guarded(record, now)
            if future is not None:
                sent.append(future)
        if sent:
            await asyncio.gather(*sent)
        return len(sent)

    async def _guarded(self, record: ObservationalRecord, now: datetime) -> asyncio.Future[Any] | None:
        """`_one`, whose failure on one row (a hostile stored message, a bug) is logged and counted
        (`swept-failed`) while the round goes on; an outage or a systemic refusal ends the round."""
        try:
            return await self._one(record, now)
        except Exception as exc:
            if not containable(exc):
                raise
            _count("swept-failed")
            log.exception(
                "observation sweep: a stale claim's work not sent again; its claim released",
                extra={"thread_id": record.thread_id, "error_type": type(exc).__name__},
            )
            # released, so the row leaves the oldest-first stale page: a row that always fails would
            # otherwise come back every round and, a page of them, starve every other stale claim; the
            # thread's next turn tries again (as the persist hook does with a failed observation)
            kind: Kind = "reflect" if record.is_reflecting else "observe"
            with contextlib.suppress(Exception):
                await self.rows.release(Claim(record.id, record.generation, record.cycle, kind), now)
            return None

    async def _one(self, record: ObservationalRecord, now: datetime) -> asyncio.Future[Any] | None:
        if not (record.is_observing or record.is_reflecting):
            # the flag was cleared by someone else (a Mastra app's own write): only the claim time is left
            await self.rows.drop_claim_time(record.id, record.cycle)
            _count("swept-released")
            return None
        kind: Kind = "reflect" if record.is_reflecting else "observe"
        held = Claim(record.id, record.generation, record.cycle, kind)
        current = await self.rows.get(record.thread_id, record.resource_id)
        unkeyed = record.thread_id is None and record.scope != "resource"
        if unkeyed or current is None or current.id != record.id:
            # an old generation's flag (nobody reads it), or a scope the service does not observe: cleared
            await self.rows.release(held, now)
            _count("swept-released")
            return None
        if kind == "observe":
            return await self._observe(record, held, now)
        claim = await self.rows.claim(record, kind, now, by=record.claimed_by)
        if claim is None:
            return None  # another replica's sweep, or a turn, took it first
        _count("reflect-reissued")
        tokens = self._settings_of(record).observation_tokens
        return await self.send(reflect_request(_work(record, claim, now), record, tokens))

    async def _observe(
        self, record: ObservationalRecord, held: Claim, now: datetime
    ) -> asyncio.Future[Any] | None:
        settings = self._settings_of(record)
        messages = await self._unobserved(record)
        if not messages:
            await self.rows.release(held, now)  # nothing left to observe (forgotten, pruned)
            _count("swept-released")
            return None
        claim = await self.rows.claim(record, "observe", now, by=record.claimed_by)
        if claim is None:
            return None
        pending = record.pending_message_tokens + count_om_messages(messages)
        threshold = dynamic_threshold(settings.message_tokens, record.observation_token_count)
        event = observe_request(
            _work(record, claim, now), record, messages, pending=pending, threshold=threshold
        )
        _count("observe-reissued")
        log.info(
            "observation sent again: its claim timed out",
            extra={"thread_id": record.thread_id, "cycle": claim.cycle, "messages": len(messages)},
        )
        return await self.send(event)

    async def _unobserved(self, record: ObservationalRecord) -> list[dict[str, Any]]:
        """The claim's work again: all the thread's unobserved messages; with resource scope, all the
        resource's threads' (each from its own cursor), oldest thread first."""
        per_page = self.settings.max_rows_per_request
        if record.scope == "resource":
            by_thread = await resource_unobserved(self.rows, record, per_page)
            return [message for _, messages in oldest_first(by_thread) for message in messages]
        assert record.thread_id is not None  # checked by `_one`
        recent = await since_observed(self.storage, record.thread_id, record, per_page)
        return unobserved_messages(recent, observed_state(record))

    def _settings_of(self, record: ObservationalRecord) -> ObservationSettings:
        """The thresholds the row was made with (`config`), over the service's defaults."""
        defaults = observation_defaults(self.settings)
        return resolve_settings(record.config, defaults) or defaults


def _work(record: ObservationalRecord, claim: Claim, now: datetime) -> dict[str, Any]:
    """The fields every OM event carries, for a row's claim (`schemas.observational.WorkBase`)."""
    return work_fields(
        claim,
        now,
        request_id=record.claimed_by or f"om-sweep:{record.id}:{claim.cycle}",
        scope="resource" if record.scope == "resource" else "thread",
        thread_id=record.thread_id if record.scope != "resource" else None,
        resource_id=record.resource_id,
    )


def _count(outcome: str) -> None:
    metrics.OUTCOMES.labels(path="observed", outcome=outcome).inc()


@contextlib.asynccontextmanager
async def sweeping(sweep: ObservationSweep) -> AsyncIterator[ObservationSweep]:
    """Run `sweep` in the background while the block runs; cancelled (and awaited) when it ends."""
    task = asyncio.create_task(sweep.run(), name="observation-sweep")
    try:
        yield sweep
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def observation_sweep(
    settings: Settings, rows: SweepRows, storage: BatchHistoryStorage, producer: OutputProducer | None
) -> AsyncIterator[ObservationSweep]:
    """The sweep of `run`, in the background while the block runs, sending on the service's shared `producer`;
    in exactly-once mode (`None`: each path produces in its transactions) on a plain producer of its own,
    opened at its first send, closed with the block (the module docstring: why a plain send is safe)."""
    async with contextlib.AsyncExitStack() as stack:
        publisher = ObservePublisher(settings.observe_requests_topic)
        send: SendWork
        if producer is None:
            send = _OwnProducer(settings, stack, publisher).publish
        else:
            channel = SendNow(producer)

            async def send(event: ObserveRequest | ReflectRequest) -> asyncio.Future[Any]:
                return await publisher.publish(channel, _SWEPT, event)

        async with sweeping(ObservationSweep(settings, rows, storage, send)) as sweep:
            yield sweep


@dataclass(frozen=True, slots=True)
class _Swept:
    """The position a sweep's send is emitted under: it answers no input record (a plain send, no batch)."""

    topic: str = ""
    partition: int = -1
    offset: int = -1


_SWEPT: Final = _Swept()


class _OwnProducer:
    """The sweep's plain producer under exactly-once: opened when it first has work to send (most rounds
    find nothing stale: no connection is held for them), entered into `stack`."""

    def __init__(
        self, settings: Settings, stack: contextlib.AsyncExitStack, publisher: ObservePublisher
    ) -> None:
        self._settings = settings
        self._stack = stack
        self._publisher = publisher
        self._channel: SendNow | None = None

    async def publish(self, event: ObserveRequest | ReflectRequest) -> asyncio.Future[Any]:
        if self._channel is None:
            producer = await self._stack.enter_async_context(
                OutputProducer(self._settings, client_id="message-history-om-sweep")
            )
            self._channel = SendNow(producer)
        return await self._publisher.publish(self._channel, _SWEPT, event)
