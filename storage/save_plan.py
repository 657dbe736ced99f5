"""What one `save_many` writes: the message and thread upserts planned from a batch of turns and the
threads they land in, ownership refused per turn, computed without reading anything back.

Two ownership checks, both refusing the whole turn before anything of it is planned: the thread's (its stored
or batch-created owner is another resource: `ThreadOwnershipError`) and each message's (its id is stored in
another thread, or an earlier turn of the batch saves it into another thread: `MessageIdTakenError`). So an
id never moves a message out of another thread, or another tenant's, and two turns of different threads
carrying one id are never merged.

Used by `MongoHistoryStorage.save_many` and by replay's dry run, so both plan the same writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pydantic_core import to_json

from message_history.core.rules import owner_refusal
from message_history.errors import InvalidInputError, MessageIdTakenError, ThreadOwnershipError
from schemas.messages import Message, utc_now_ms
from storage.documents import EXTRA_FIELD
from storage.protocol import SaveTurn, Thread
from storage.update_command import Statement


@dataclass(slots=True)
class MessageWrite:
    """One message's upsert; later saves of the same id in a batch replace `fields`, keep `created`."""

    fields: dict[str, Any]
    extra: str | None
    created: datetime

    def op(self, *, by_id_field: bool = False) -> Statement:
        """The upsert, by `_id` (= the message id: a primary-key lookup) or by `id` (Mastra's own rows)."""
        update: dict[str, Any] = {"$set": dict(self.fields), "$setOnInsert": {"createdAt": self.created}}
        if self.extra is None:
            update["$unset"] = {EXTRA_FIELD: ""}
        else:
            update["$set"][EXTRA_FIELD] = self.extra
        key = self.fields["id"]
        return {"q": {"id": key} if by_id_field else {"_id": key}, "u": update, "upsert": True}


@dataclass(slots=True)
class _ThreadWrite:
    resource_id: str
    earliest: datetime
    newest: datetime
    doc_key: Any = None  # the stored thread's `_id` (Mastra's are ObjectIds), None for a new thread

    def op(self, thread_id: str, *, by_id_field: bool = False) -> Statement:
        """The thread's upsert, keyed by its stored `_id`, else `_id` = thread id, or (fallback) by `id`.

        `$setOnInsert` keeps an existing thread's title, metadata and createdAt; `$max` moves updatedAt
        forward only (atomically on MongoDB), from message times, so that a replayed turn changes nothing.
        """
        if by_id_field:
            key: dict[str, Any] = {"id": thread_id}
        else:
            key = {"_id": thread_id if self.doc_key is None else self.doc_key}
        return {
            "q": key,
            "u": {
                "$setOnInsert": {
                    "id": thread_id,
                    "resourceId": self.resource_id,
                    "title": "",
                    "metadata": {},
                    "createdAt": self.earliest,
                },
                "$max": {"updatedAt": self.newest},
            },
            "upsert": True,
        }


class SavePlan:
    """The writes of a batch of turns, planned in turn order against the threads as they stand."""

    def __init__(
        self,
        threads: dict[str, Thread],
        keys: dict[str, Any],
        now: datetime,
        homes: Mapping[str, str | None] | None = None,
    ) -> None:
        self.state = threads  # stored threads, then as each accepted turn leaves them
        self.keys = keys  # stored threads' `_id`s
        self.now = now
        self.homes = dict(homes or {})  # stored message ids -> their thread, then the batch's accepted saves
        self.messages: dict[str, MessageWrite] = {}
        self.threads: dict[str, _ThreadWrite] = {}

    def add(self, turn: SaveTurn) -> Thread | ThreadOwnershipError:
        """Plan one turn; its result: the thread after it, or the refusal."""
        current = self.state.get(turn.thread_id)
        refusal = owner_refusal(current, turn.thread_id, turn.resource_id)
        if refusal is not None:
            return refusal
        for message in turn.messages:
            if (
                message.id is not None
                and message.id in self.homes
                and self.homes[message.id] != turn.thread_id
            ):
                return MessageIdTakenError(turn.thread_id, turn.resource_id, message.id)
        if not turn.messages:
            if current is None:
                raise InvalidInputError(f"nothing to save into thread {turn.thread_id!r}: it does not exist")
            return current
        writes = [message_write(m, turn.thread_id, turn.resource_id, self.now) for m in turn.messages]
        for write in writes:
            earlier = self.messages.pop(write.fields["id"], None)  # re-added: the bulk keeps last-save order
            if earlier is not None:
                write.created = earlier.created
            self.messages[write.fields["id"]] = write
            self.homes[write.fields["id"]] = turn.thread_id
        earliest = min(w.created for w in writes)
        newest = max(w.created for w in writes)
        pending = self.threads.get(turn.thread_id)
        if pending is None:
            self.threads[turn.thread_id] = _ThreadWrite(
                turn.resource_id, earliest, newest, self.keys.get(turn.thread_id)
            )
        else:
            pending.earliest = min(pending.earliest, earliest)
            pending.newest = max(pending.newest, newest)
        if current is None:
            current = Thread(turn.thread_id, turn.resource_id, "", {}, createdAt=earliest, updatedAt=newest)
        elif current.updatedAt is None or current.updatedAt < newest:
            # `replace(current, updatedAt=newest)`, without its generic field walk (issue 33)
            current = Thread(
                current.id, current.resourceId, current.title, current.metadata, current.createdAt, newest
            )
        self.state[turn.thread_id] = current
        return current


@dataclass(frozen=True, slots=True)
class SaveReads:
    """What `save_many` reads before planning, read earlier (with the batch's other reads) and handed in.

    `threads`/`keys`: the stored threads among `thread_ids` and their documents' `_id`s; `homes`: the thread
    each stored id among `message_ids` is in. An id or thread outside the two sets was not read.
    """

    thread_ids: frozenset[str]
    threads: Mapping[str, Thread]
    keys: Mapping[str, Any]
    message_ids: frozenset[str]
    homes: Mapping[str, str | None]

    def missing(self, turns: Sequence[SaveTurn]) -> tuple[list[str], list[str]]:
        """(threads, message ids) of `turns` these reads do not cover: what a save must still read."""
        threads = [t for t in dict.fromkeys(turn.thread_id for turn in turns) if t not in self.thread_ids]
        ids = [m.id for t in turns for m in t.messages if m.id is not None and m.id not in self.message_ids]
        return threads, list(dict.fromkeys(ids))

    def known_homes(self, rows: Sequence[Message]) -> SaveReads:
        """These reads, plus the homes of `rows` read from their thread (the newest rows a merge may
        continue: their ids are saved again, in their own thread)."""
        homes = {m.id: m.threadId for m in rows if m.id is not None and m.threadId is not None}
        if not homes.keys() - self.message_ids:
            return self
        return replace(self, message_ids=self.message_ids | homes.keys(), homes={**homes, **self.homes})


def plan_saves(
    turns: Sequence[SaveTurn],
    threads: Mapping[str, Thread],
    keys: Mapping[str, Any] | None = None,
    *,
    homes: Mapping[str, str | None] | None = None,
    now: datetime | None = None,
    check: bool = True,
) -> tuple[list[Thread | ThreadOwnershipError], SavePlan]:
    """What `save_many` returns for `turns` and the writes it makes, against the stored `threads` and the
    threads the turns' message ids are stored in (`homes`, by id; ids absent there are new); no I/O.

    `save_many` writes the plan; replay's dry run answers with the results and writes nothing. Refuses (with
    `InvalidInputError`, before planning anything) a turn whose thread id or a message id is unusable.
    """
    if check:
        _check_turns(turns)
    plan = SavePlan(dict(threads), dict(keys or {}), now or utc_now_ms(), homes)
    return [plan.add(turn) for turn in turns], plan


def message_write(message: Message, thread_id: str, resource_id: str, now: datetime) -> MessageWrite:
    """The `mastra_messages` document of `message` as a save writes it (`now`: its time when it has none)."""
    extra = message.model_extra
    return MessageWrite(
        fields={
            "id": message.id,
            "thread_id": thread_id,
            "content": message.content.model_dump_json(exclude_unset=True),
            "role": message.role,
            "type": message.type or "v2",
            "resourceId": message.resourceId or resource_id,
        },
        extra=to_json(extra).decode() if extra else None,
        created=message.createdAt or now,
    )


def _check_thread_id(thread_id: str) -> None:
    if not thread_id or not thread_id.strip():
        raise InvalidInputError("thread id must not be empty")


def _check_turns(turns: Sequence[SaveTurn]) -> None:
    for turn in turns:
        _check_thread_id(turn.thread_id)
        for message in turn.messages:
            if not message.id:
                raise InvalidInputError(f"a message to save into thread {turn.thread_id!r} has no id")
