"""The commands topic: `ForgetThread` and `ForgetResource`, each answered by a `HistoryForgotten`.

A command is JSON with a `command` field naming it, keyed like the other events (the thread id for
`ForgetThread`, the resource id for `ForgetResource`). The service forgets the history it names (messages
and threads, in MongoDB), leaves a tombstone so that a replay or a late redelivery cannot write it back, and
answers with one `HistoryForgotten` on the forgotten topic. Forgetting twice is harmless: the second answer
counts zero.
"""

# ruff: noqa: N815 -- field names are the wire names, camelCase as Mastra writes them
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, Field, StrictBool, TypeAdapter, ValidationError

from message_history.errors import EventValidationError
from schemas.codec import check_id, check_raw, encode, validation_error
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
    check_raw(raw, limits, "command")
    try:
        command = _COMMAND.validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc) from None  # the events' wording ("not valid JSON: ...")
    if "schemaVersion" not in command.model_fields_set:  # required on the wire, as for the events
        raise EventValidationError("Field required", "schemaVersion")
    ids = [("requestId", command.requestId), ("resourceId", command.resourceId)]
    if isinstance(command, ForgetThread):
        ids.append(("threadId", command.threadId))
    for path, value in ids:
        if value is not None:
            check_id(value, path, limits)
    return command


def command_key(command: ForgetThread | ForgetResource) -> bytes:
    """The record key of a command and of its answer: the thread id, or the resource id."""
    return (command.threadId if isinstance(command, ForgetThread) else command.resourceId).encode()


@dataclass(slots=True)
class ForgetOutcome:
    """What one forget removed (or, for a dry run, found): `storage.forgetting` reports it, the answer and
    the audit line say it."""

    scope: Scope
    target: str  # the thread id or the resource id
    forgotten_at: datetime
    dry_run: bool
    message_ids: list[str] = field(default_factory=list)
    thread_ids: list[str] = field(default_factory=list)
    deleted_messages: int = 0
    deleted_threads: int = 0


def forgotten_event(
    outcome: ForgetOutcome, command: ForgetThread | ForgetResource | None, *, request_id: str
) -> HistoryForgotten:
    """The answer to `command` (None: the `forget` command line), whose createdAt it carries (the forget time
    without one); id lists are cut at `MAX_LISTED_IDS` (the counts are not)."""
    optional: dict[str, Any] = {}
    if command is not None and "metadata" in command.model_fields_set:
        optional["metadata"] = command.metadata
    if outcome.scope == "thread":
        thread_id, resource_id = outcome.target, command.resourceId if command is not None else None
    else:
        thread_id, resource_id = None, outcome.target
    message_ids, thread_ids = outcome.message_ids, outcome.thread_ids
    return HistoryForgotten(
        requestId=request_id,
        eventId=request_id,
        createdAt=command.createdAt if command is not None else outcome.forgotten_at,
        forgottenAt=outcome.forgotten_at,
        scope=outcome.scope,
        threadId=thread_id,
        resourceId=resource_id,
        dryRun=outcome.dry_run,
        deletedMessages=outcome.deleted_messages,
        deletedThreads=outcome.deleted_threads,
        messageIds=message_ids[:MAX_LISTED_IDS],
        threadIds=thread_ids[:MAX_LISTED_IDS],
        idsTruncated=len(message_ids) > MAX_LISTED_IDS or len(thread_ids) > MAX_LISTED_IDS,
        **optional,
    )


def encode_answer(event: BaseModel) -> bytes:
    """The answer as UTF-8 JSON (every field written)."""
    if isinstance(event, HistoryForgotten):
        event.model_fields_set.update(HistoryForgotten.model_fields)
    return encode(event)
