"""The commands path: `agent.history.commands` in (`ForgetThread`, `ForgetResource`), `HistoryForgotten` out.

Commands are rare and each one may delete many rows, so a batch runs them one after the other, in order, each
in bounded chunks (`MESSAGE_HISTORY_FORGET_CHUNK_SIZE` rows a step, each operation under the CLI's longer
timeout) with progress (`ForgetProgress`: a metric as it goes, a log line every few seconds). An outage raises
(the loop retries the batch; forgetting is idempotent, so a command run twice, or interrupted and run again,
answers with the same effect: the second run counts what it deleted). A command that cannot be decoded, or
that names a thread another resource owns, is a dead letter, and so is one whose decode or forget raises
anything else that is neither an outage nor a systemic refusal (containment's `containable`: a bug,
logged at ERROR when it is dead-lettered). Every forget is written to the log as an audit line (`"audit":
"forget"`), with counts and ids but no content.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from consumers.contract import Done, Emit, Record, Refused, Result, record_headers
from consumers.runtime.containment import contain, containable
from message_history import metrics
from message_history.errors import EventValidationError
from producers.forgotten import ForgottenPublisher
from schemas.commands import ForgetOutcome, ForgetThread, command_key, decode_command, forgotten_event
from schemas.limits import Limits

log = logging.getLogger(__name__)

PATH = "commands"


class Forgetting(Protocol):
    """The part of `storage.forgetting.MongoForgetting` the path uses."""

    async def forget_thread(
        self,
        thread_id: str,
        *,
        resource_id: str | None = None,
        dry_run: bool = False,
        progress: Callable[[ForgetOutcome], None] | None = None,
    ) -> ForgetOutcome: ...

    async def forget_resource(
        self,
        resource_id: str,
        *,
        dry_run: bool = False,
        progress: Callable[[ForgetOutcome], None] | None = None,
    ) -> ForgetOutcome: ...


def audit(outcome: ForgetOutcome, *, request_id: str, via: str) -> None:
    """The audit line of one forget: what, when, how much, by which request; never message content."""
    log.info(
        "history forgotten" if not outcome.dry_run else "history forget (dry run): nothing deleted",
        extra={
            "audit": "forget",
            "via": via,
            "scope": outcome.scope,
            "target": outcome.target,
            "request_id": request_id,
            "dry_run": outcome.dry_run,
            "deleted_messages": outcome.deleted_messages,
            "deleted_threads": outcome.deleted_threads,
            "thread_ids": outcome.thread_ids[:100],
            "forgotten_at": outcome.forgotten_at.isoformat(),
        },
    )


PROGRESS_LOG_S: Final = 5.0  # a long forget's progress line at most this often (the first chunk's always)


class ForgetProgress:
    """A forget's progress as it deletes, chunk by chunk: the rows it deleted counted in
    `message_history_forget_deleted` at once, and a log line (`"audit": "forget-progress"`) at most every
    `every_s` seconds; `show` (the CLI's stderr line) the same way."""

    def __init__(
        self,
        *,
        request_id: str,
        via: str,
        every_s: float = PROGRESS_LOG_S,
        show: Callable[[str], None] | None = None,
    ) -> None:
        self._request_id = request_id
        self._via = via
        self._every_s = every_s
        self._show = show
        self._messages = 0
        self._threads = 0
        self._said: float | None = None
        self.chunks = 0

    def __call__(self, outcome: ForgetOutcome) -> None:
        self.chunks += 1
        metrics.FORGET_DELETED.labels(what="messages").inc(max(0, outcome.deleted_messages - self._messages))
        metrics.FORGET_DELETED.labels(what="threads").inc(max(0, outcome.deleted_threads - self._threads))
        self._messages, self._threads = outcome.deleted_messages, outcome.deleted_threads
        now = time.monotonic()
        if self._said is not None and now - self._said < self._every_s:
            return
        self._said = now
        log.info(
            "forget in progress",
            extra={
                "audit": "forget-progress",
                "via": self._via,
                "scope": outcome.scope,
                "target": outcome.target,
                "request_id": self._request_id,
                "deleted_messages": outcome.deleted_messages,
                "deleted_threads": outcome.deleted_threads,
            },
        )
        if self._show is not None:
            self._show(
                f"forget {outcome.scope} {outcome.target!r}: {outcome.deleted_messages} messages, "
                f"{outcome.deleted_threads} threads deleted so far"
            )


class CommandsHandler:
    """Runs a batch of forget commands in order and answers each."""

    def __init__(self, *, forgetting: Forgetting, publisher: ForgottenPublisher, limits: Limits) -> None:
        self._forgetting = forgetting
        self._publisher = publisher
        self._limits = limits

    async def handle(self, records: Sequence[Record], emit: Emit) -> list[Result]:
        results: list[Result] = []
        for record in records:
            if record.value is None:
                results.append(Refused(EventValidationError("empty record (no value)")))
                continue
            try:
                command = decode_command(record.value, self._limits)
                progress = ForgetProgress(request_id=command.requestId, via="commands-topic")
                if isinstance(command, ForgetThread):
                    outcome = await self._forgetting.forget_thread(
                        command.threadId,
                        resource_id=command.resourceId,
                        dry_run=command.dryRun,
                        progress=progress,
                    )
                else:
                    outcome = await self._forgetting.forget_resource(
                        command.resourceId, dry_run=command.dryRun, progress=progress
                    )
            except Exception as exc:
                if not containable(exc):
                    raise
                results.append(Refused(contain(exc, "process")))
                continue
            audit(outcome, request_id=command.requestId, via="commands-topic")
            try:
                event = forgotten_event(outcome, command, request_id=command.requestId)
            except Exception as exc:  # the forget is done (and idempotent): only this answer cannot be built
                if not containable(exc):
                    raise
                results.append(Refused(contain(exc, "output")))
                continue
            sent = await self._publisher.publish(
                emit, record, event, key=command_key(command), headers=record_headers(record)
            )
            results.append(Done(sent))
            metrics.OUTCOMES.labels(path=PATH, outcome=f"forgot-{outcome.scope}").inc()
        return results
