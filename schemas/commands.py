"""The commands topic: `ForgetThread` and `ForgetResource`, each answered by a `HistoryForgotten`.

A command is JSON with a `command` field naming it, keyed like the other events (the thread id for
`ForgetThread`, the resource id for `ForgetResource`). The service forgets the history it names (messages
and threads, in MongoDB), leaves a tombstone so that a replay or a late redelivery cannot write it back, and
answers with one `HistoryForgotten` on the forgotten topic. Forgetting twice is harmless: the second answer
counts zero.
"""

# ruff: noqa: N815 -- field names are the wire names, camelCase as Mastra writes them
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, TypeAdapter, ValidationError

from message_history.errors import EventValidationError
from schemas.codec import encode, error_path, schema_registry_framing
from schemas.events import SchemaVersion
from schemas.limits import Limits
from schemas.messages import Open, Timestamp

MAX_LISTED_IDS: Final = 1000
"""Most message (and thread) ids one `HistoryForgotten` lists; the counts are always complete."""

Scope = Literal["thread", "resource"]


class CommandBase(Open):
    """Fields every command carries."""

    schemaVersion: SchemaVersion = 1
    requestId: Annotated[str, Field(description="the command's id; the answer's eventId")]
    createdAt: Annotated[Timestamp, Field(description="when the command was produced, ISO-8601 UTC")]
    dryRun: Annotated[StrictBool, Field(description="count and list only; delete nothing")] = False
    metadata: Annotated[dict[str, Any] | None, Field(description="free-form, passed to the answer")] = None


class ForgetThread(CommandBase):
    """Forget one thread: its messages, the thread, and (tombstone) any later write of its earlier turns."""

    command: Literal["ForgetThread"]
    threadId: Annotated[str, Field(description="the thread to forget; also the record key")]
    resourceId: Annotated[
        str | None, Field(description="when given, must be the thread's owner, else the command is refused")
    ] = None


class ForgetResource(CommandBase):
    """Forget everything of one resource (user, tenant): its threads, their messages, its other messages."""

    command: Literal["ForgetResource"]
    resourceId: Annotated[str, Field(description="the resource to forget; also the record key")]


Command = Annotated[ForgetThread | ForgetResource, Field(discriminator="command")]
_COMMAND: TypeAdapter[ForgetThread | ForgetResource] = TypeAdapter(Command)


class HistoryForgotten(Open):
    """The answer to a forget command: what was removed (or, for a dry run, would be)."""

    model_config = ConfigDict(title="HistoryForgotten")

    schemaVersion: SchemaVersion = 1
    requestId: str
    eventId: Annotated[str, Field(description="equal to the command's requestId")]
    createdAt: Annotated[Timestamp, Field(description="the command's createdAt")]
    forgottenAt: Annotated[Timestamp, Field(description="when the service forgot it (the tombstone's time)")]
    scope: Scope
    threadId: str | None = None
    resourceId: str | None = None
    dryRun: bool = False
    deletedMessages: Annotated[int, Field(description="messages removed (dry run: that would be)")]
    deletedThreads: Annotated[int, Field(description="threads removed (dry run: that would be)")]
    messageIds: Annotated[list[str], Field(description=f"the messages' ids, at most {MAX_LISTED_IDS}")]
    threadIds: Annotated[list[str], Field(description=f"the threads' ids, at most {MAX_LISTED_IDS}")]
    idsTruncated: Annotated[bool, Field(description="true when an id list was cut at its maximum")] = False
    metadata: dict[str, Any] | None = None


def decode_command(raw: bytes, limits: Limits = Limits()) -> ForgetThread | ForgetResource:  # noqa: B008
    """Decode and check a commands-topic record value; anything wrong is one `EventValidationError`."""
    if len(raw) > limits.max_event_bytes:
        raise EventValidationError(f"command is {len(raw)} bytes; the limit is {limits.max_event_bytes}")
    framed = schema_registry_framing(raw)
    if framed is not None:
        raise EventValidationError(framed)
    try:
        command = _COMMAND.validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
        raise EventValidationError(first["msg"][:200], error_path(first["loc"])) from None
    ids = [("requestId", command.requestId), ("resourceId", command.resourceId)]
    if isinstance(command, ForgetThread):
        ids.append(("threadId", command.threadId))
    for path, value in ids:
        if value is None:
            continue
        if not value.strip():
            raise EventValidationError("must not be empty or blank", path)
        if len(value) > limits.max_id_length:
            limit = limits.max_id_length
            raise EventValidationError(f"is {len(value)} characters; the limit is {limit}", path)
    return command


def command_key(command: ForgetThread | ForgetResource) -> bytes:
    """The record key of a command and of its answer: the thread id, or the resource id."""
    return (command.threadId if isinstance(command, ForgetThread) else command.resourceId).encode()


def forgotten_event(
    command: ForgetThread | ForgetResource | None,
    *,
    scope: Scope,
    thread_id: str | None,
    resource_id: str | None,
    forgotten_at: datetime,
    message_ids: Sequence[str],
    thread_ids: Sequence[str],
    deleted_messages: int,
    deleted_threads: int,
    dry_run: bool,
    request_id: str,
    created_at: datetime,
) -> HistoryForgotten:
    """The answer; id lists are cut at `MAX_LISTED_IDS` (the counts are not)."""
    optional: dict[str, Any] = {}
    if command is not None and "metadata" in command.model_fields_set:
        optional["metadata"] = command.metadata
    return HistoryForgotten(
        requestId=request_id,
        eventId=request_id,
        createdAt=created_at,
        forgottenAt=forgotten_at,
        scope=scope,
        threadId=thread_id,
        resourceId=resource_id,
        dryRun=dry_run,
        deletedMessages=deleted_messages,
        deletedThreads=deleted_threads,
        messageIds=list(message_ids[:MAX_LISTED_IDS]),
        threadIds=list(thread_ids[:MAX_LISTED_IDS]),
        idsTruncated=len(message_ids) > MAX_LISTED_IDS or len(thread_ids) > MAX_LISTED_IDS,
        **optional,
    )


def encode_answer(event: BaseModel) -> bytes:
    """The answer as UTF-8 JSON (every field written)."""
    if isinstance(event, HistoryForgotten):
        event.model_fields_set.update(HistoryForgotten.model_fields)
    return encode(event)
