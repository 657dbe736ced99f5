"""Where the live handlers' outputs go during a replay: recording publishers, the counted (or dry-run)
storage, and the JSONL report of bad records."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import IO, Any, ClassVar, TypeVar

from message_history.app.replay.options import CLIENT_ID
from message_history.app.replay.plan import Counts, distinct
from message_history.errors import InvalidInputError, error_type
from message_history.futures import resolved_after
from message_history.settings import Settings
from producers.enriched import EnrichedPublisher
from producers.output import Emit, Headers, Positioned, TopicPublisher
from producers.persisted import PersistedPublisher
from schemas.dead_letters import error_message
from schemas.events import EnrichedRequest, HistoryPersisted
from schemas.messages import Message
from storage.errors import storage_errors
from storage.forgetting import MongoForgetting
from storage.mongodb import MongoHistoryStorage
from storage.protocol import Page, PageQuery, RecallQuery, SaveTurn, Thread, save_one
from storage.save_plan import plan_saves

T = TypeVar("T")

_MONGO_MAX_BATCH = 100_000


# --- publishers that record what the handlers did ----------------------------------------------------------


def _resolved(value: T) -> asyncio.Future[T]:
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


class _Recording(TopicPublisher):
    """A replay publisher: each acknowledgement resolves with its event, which is sent on (through the
    batch's `Emit`) only with `emit` (otherwise nothing is sent)."""

    def __init__(self, topic: str, *, emit: bool) -> None:
        super().__init__(topic)
        self.emit = emit

    async def _recorded(
        self, event: T, send: Callable[[], Awaitable[asyncio.Future[Any]]]
    ) -> asyncio.Future[T]:
        if not self.emit:
            return asyncio.ensure_future(_as_outcome(event))
        return resolved_after(await send(), event)


class PersistedOutcomes(_Recording, PersistedPublisher):
    """The persist handler's publisher: the acknowledgement resolves with the `HistoryPersisted` event."""

    async def publish(
        self, emit: Emit, record: Positioned, event: HistoryPersisted, *, headers: Headers
    ) -> asyncio.Future[Any]:
        return await self._recorded(event, partial(super().publish, emit, record, event, headers=headers))

    async def publish_value(
        self, emit: Emit, record: Positioned, thread_id: str, value: bytes, *, headers: Headers
    ) -> asyncio.Future[Any]:
        # the handler sends its outcomes encoded; a replay tallies them as events
        event = HistoryPersisted.model_validate_json(value)
        send = partial(super().publish_value, emit, record, thread_id, value, headers=headers)
        return await self._recorded(event, send)


class EnrichedOutcomes(_Recording, EnrichedPublisher):
    """The recall handler's publisher: the acknowledgement resolves with the `EnrichedRequest`."""

    sends_encoded: ClassVar[bool] = False

    async def publish(
        self, emit: Emit, record: Positioned, event: EnrichedRequest, *, headers: Headers
    ) -> asyncio.Future[Any]:
        return await self._recorded(event, partial(super().publish, emit, record, event, headers=headers))


async def _as_outcome(event: T) -> T:
    return event


# --- the storage, counted (and, for a dry run, not written) ------------------------------------------------


class ReplayStorage:
    """The MongoDB storage with the batch forms, counting what each `save_many` inserts or finds present.

    With `dry_run`, `save_many` plans the writes (ownership, the threads it would create) and writes nothing;
    those threads and message ids are remembered so that later batches see them, as the live service would.
    """

    def __init__(self, mongo: MongoHistoryStorage, counts: Counts, *, dry_run: bool) -> None:
        self._mongo = mongo
        self.tombstones = MongoForgetting(mongo.db)  # forgotten history is not replayed back
        self._counts = counts
        self.dry_run = dry_run
        self._virtual: dict[str, Thread] = {}  # dry run: threads it would have created
        self._planned: set[str] = set()  # dry run: message ids it would have inserted
        self._planned_homes: dict[str, str | None] = {}  # dry run: the threads it would have saved them in
        self._threads_seen: set[str] = set()

    async def get_thread(self, thread_id: str) -> Thread | None:
        return (await self.get_threads([thread_id])).get(thread_id)

    async def get_threads(self, thread_ids: Sequence[str]) -> dict[str, Thread]:
        found = await self._mongo.get_threads(thread_ids)
        return self._with_planned(found, thread_ids, self._virtual)

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        return await self._mongo.list_messages(thread_id, resource_id=resource_id, limit=limit)

    async def list_messages_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        return await self._mongo.list_messages_many(queries)

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        return await self._mongo.get_messages(message_ids, thread_ids=thread_ids)

    async def message_homes(self, message_ids: Collection[str]) -> dict[str, str | None]:
        """The thread each stored id is in (a dry run: and the ids it would have saved), for the persist
        path's derived ids held by another thread (`PersistHandler._yield_taken_ids`)."""
        homes = await self._mongo.message_homes(message_ids)
        return self._with_planned(homes, message_ids, self._planned_homes)

    def _with_planned(
        self, found: dict[str, T], keys: Iterable[str], planned: Mapping[str, T]
    ) -> dict[str, T]:
        """`found`; in a dry run, with what it planned (and MongoDB lacks) for `keys` added."""
        if self.dry_run:
            found.update({key: planned[key] for key in keys if key not in found and key in planned})
        return found

    async def list_page(self, query: PageQuery) -> Page:
        return await self._mongo.list_page(query)

    async def list_pages_many(self, queries: Sequence[PageQuery]) -> list[Page]:
        return await self._mongo.list_pages_many(queries)

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        if not self.dry_run:  # a dry run changes nothing, boundaries included
            await self._mongo.save_thread_metadata(thread_id, update)

    async def save_thread_metadata_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        if not self.dry_run:
            await self._mongo.save_thread_metadata_many(updates)

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        return await save_one(self, thread_id=thread_id, resource_id=resource_id, messages=messages)

    async def save_many(self, turns: Sequence[SaveTurn]) -> list[Thread | InvalidInputError]:
        ids = distinct(m.id for turn in turns for m in turn.messages if m.id)
        present = await self.existing_ids(ids)
        stored: dict[str, Thread] = {}
        if self.dry_run:
            stored = await self._mongo.get_threads([t.thread_id for t in turns])
            present |= self._planned.intersection(ids)
            homes = {**self._planned_homes, **await self._mongo.message_homes(ids)}
            results = self._plan(turns, stored, homes)
        else:
            results = await self._mongo.save_many(turns)
        accepted: set[str] = set()
        for turn, result in zip(turns, results, strict=True):
            if isinstance(result, InvalidInputError):
                continue
            accepted.update(m.id for m in turn.messages if m.id)
            if turn.messages and turn.thread_id not in self._threads_seen:
                self._threads_seen.add(turn.thread_id)
                self._counts.threads += 1
                if self.dry_run and turn.thread_id not in stored:
                    self._counts.threads_new += 1
        self._counts.messages_inserted += len(accepted - present)
        self._counts.messages_present += len(accepted & present)
        if self.dry_run:
            self._planned |= accepted
        return results

    async def existing_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` `mastra_messages` holds: one `$in` query (none for no ids)."""
        if not ids:
            return set()
        with storage_errors("find stored message ids"):
            docs = await self._mongo.messages.find(
                {"id": {"$in": list(ids)}},
                {"id": 1, "_id": 0},
                batch_size=min(len(ids) + 1, _MONGO_MAX_BATCH),
            ).to_list()
        return {doc["id"] for doc in docs if "id" in doc}

    def _plan(
        self, turns: Sequence[SaveTurn], stored: dict[str, Thread], homes: dict[str, str | None]
    ) -> list[Thread | InvalidInputError]:
        """What `save_many` would return, without writing: the storage's own planner, against the stored
        threads and message homes and those this dry run would have created."""
        known = {**{k: v for k, v in self._virtual.items() if k not in stored}, **stored}
        results, plan = plan_saves(turns, known, homes=homes)
        self._virtual.update({k: v for k, v in plan.state.items() if k not in stored})
        self._planned_homes.update({i: w.fields["thread_id"] for i, w in plan.messages.items()})
        return list(results)


@contextlib.asynccontextmanager
async def open_mongo(settings: Settings, *, dry_run: bool) -> AsyncIterator[MongoHistoryStorage]:
    """The live service's MongoDB storage, named as the replay; a dry run connects the same way but creates
    no index."""
    async with MongoHistoryStorage.open(settings, appname=CLIENT_ID, create_indexes=not dry_run) as storage:
        yield storage


# --- bad records -------------------------------------------------------------------------------------------


class InvalidReport:
    """The JSONL report of bad records (`--invalid-report`), one object per record; appended to."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def __enter__(self) -> InvalidReport:
        if self.path is not None:
            self._file = self.path.open("a", encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def write(self, record: Any, error: BaseException, *, dead_letter_topic: str | None) -> None:
        if self._file is None:
            return
        key = record.key
        entry = {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            # an unreadable batch's record (`consumers.unreadable`) has no timestamp: its bytes never parsed
            "timestamp": getattr(record, "timestamp", None),
            "key": key.decode("utf-8", errors="replace") if key is not None else None,
            "error_type": error_type(error),
            "error_message": error_message(error).decode("utf-8", errors="replace"),
            "error_path": getattr(error, "path", None) or None,
            "dead_letter_topic": dead_letter_topic,
        }
        self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._file.flush()
