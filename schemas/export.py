"""`message-history schemas`: the JSON Schema of every event and an AsyncAPI 3.0 document of the topics.

The output is a pure function of the models (sorted keys, two-space indent, trailing newline), committed under
`schemas/generated/`; `--check` (and a unit test) fails when the committed files no longer match the models.
JSON rather than YAML so no dependency is needed; AsyncAPI tools read both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from schemas.commands import ForgetResource, ForgetThread, HistoryForgotten
from schemas.dead_letters import (
    ERROR_MESSAGE,
    ERROR_PATH,
    ERROR_TYPE,
    FAILED_AT,
    MAX_MESSAGE_BYTES,
    SERVICE_VERSION,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
)
from schemas.events import (
    SCHEMA_VERSION,
    AgentRequest,
    AgentResponse,
    EnrichedRequest,
    HistoryPersisted,
)
from schemas.limits import Limits
from schemas.messages import Message
from schemas.observational import ObserveRequest, ObserveResult, ReflectRequest, ReflectResult

JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
KAFKA_BINDING_VERSION: Final = "0.5.0"
ASYNCAPI_FILE: Final = "asyncapi.json"

SCHEMA_MODELS: Final[tuple[type[BaseModel], ...]] = (
    AgentRequest,
    EnrichedRequest,
    AgentResponse,
    HistoryPersisted,
    Message,
    ForgetThread,
    ForgetResource,
    HistoryForgotten,
)
COMMAND_MODELS: Final[tuple[type[BaseModel], ...]] = (ForgetThread, ForgetResource, HistoryForgotten)
OBSERVATIONAL_MODELS: Final[tuple[type[BaseModel], ...]] = (
    ObserveRequest,
    ObserveResult,
    ReflectRequest,
    ReflectResult,
)
"""Observational Memory's events (docs/observational-memory.md), on `agent.memory.observe` / `.observed`."""

# (channel id, default topic, setting, value model(s), description)
_Value = type[BaseModel] | tuple[type[BaseModel], ...]
_TOPICS: Final[tuple[tuple[str, str, str, _Value, str], ...]] = (
    ("requests", "agent.requests", "MESSAGE_HISTORY_REQUESTS_TOPIC", AgentRequest,
     "New turns, written by clients or an API gateway; read by the service's recall path."),
    ("enriched", "agent.requests.enriched", "MESSAGE_HISTORY_ENRICHED_TOPIC", EnrichedRequest,
     "Each request with its recalled history, written by the service; read by agent workers."),
    ("responses", "agent.responses", "MESSAGE_HISTORY_RESPONSES_TOPIC", AgentResponse,
     "Finished turns, written by agent workers; read by the service's persist path."),
    ("persisted", "agent.history.persisted", "MESSAGE_HISTORY_PERSISTED_TOPIC", HistoryPersisted,
     "What the persist path saved for each response; for UI sync, analytics, auditing."),
    ("commands", "agent.history.commands", "MESSAGE_HISTORY_COMMANDS_TOPIC", (ForgetThread, ForgetResource),
     "Forget commands (erasure), written by applications or operators; read by the service's commands path."),
    ("forgotten", "agent.history.forgotten", "MESSAGE_HISTORY_FORGOTTEN_TOPIC", HistoryForgotten,
     "What each forget command removed (counts and ids); for auditing and the requester."),
    ("observe", "agent.memory.observe", "MESSAGE_HISTORY_OBSERVE_REQUESTS_TOPIC",
     (ObserveRequest, ReflectRequest),
     "Observational Memory's work, written by the service's persist path; read by observer workers."),
    ("observed", "agent.memory.observed", "MESSAGE_HISTORY_OBSERVE_RESULTS_TOPIC",
     (ObserveResult, ReflectResult),
     "Observers' answers, written by observer workers; read by the service's observed path."),
)  # fmt: skip

# The input topics with a dead-letter topic: (input channel, what its dead letters are, the operation that
# sends them, its summary). The dead-letter channel follows from its input's row as the settings name it:
# `<input topic>.dlq`, `MESSAGE_HISTORY_<INPUT>_DLQ_TOPIC` (`message_history.settings`).
_DEAD_LETTERS: Final = (
    ("requests", "Requests", "sendRequestDeadLetters", "Refuse a bad request."),
    ("responses", "Responses", "sendResponseDeadLetters", "Refuse a bad response."),
    ("commands", "Commands", "sendCommandDeadLetters", "Refuse a bad or unauthorized command."),
    ("observed", "Observer answers", "sendObservedDeadLetters", "Refuse a bad observer answer."),
)

# From the service's point of view: what it receives and what it sends (and the dead letters above).
_OPERATIONS: Final = (
    ("receiveRequests", "receive", "requests", "Recall: read a request, load the thread's history."),
    ("sendEnriched", "send", "enriched", "Recall: publish the request with its context."),
    ("receiveResponses", "receive", "responses", "Persist: read a finished turn."),
    ("sendPersisted", "send", "persisted", "Persist: publish what was saved."),
    ("receiveCommands", "receive", "commands", "Commands: read a forget command, erase, leave a tombstone."),
    ("sendForgotten", "send", "forgotten", "Commands: publish what was forgotten."),
    ("sendObserve", "send", "observe", "Persist: a thread's unobserved messages passed the threshold."),
    ("receiveObserved", "receive", "observed", "Observed: apply an observer's answer once, to its claim."),
    *((op_id, "send", f"{channel}DeadLetters", summary) for channel, _, op_id, summary in _DEAD_LETTERS),
)


def _dump(document: Any) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _header(description: str, **schema: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **schema}


def _trace_headers() -> dict[str, Any]:
    return {
        "traceparent": _header("W3C Trace Context; copied from the input record to every output"),
        "tracestate": _header("W3C Trace Context vendor state; copied like traceparent"),
    }


def _event_headers() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Kafka record headers. Every header of an input record is copied to its outputs.",
        "properties": _trace_headers(),
        "additionalProperties": True,
    }


def _dead_letter_headers() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "The original record's headers, plus these (which replace any of the same name).",
        "properties": {
            **_trace_headers(),
            ERROR_TYPE: _header(
                "error class: EventValidationError, ThreadOwnershipError, ...",
                examples=["EventValidationError"],
            ),
            ERROR_MESSAGE: _header(
                f"why, secrets masked, at most {MAX_MESSAGE_BYTES} bytes of UTF-8",
                examples=["messages.2.role: Input should be 'user', 'assistant', 'system' or 'signal'"],
            ),
            ERROR_PATH: _header(
                "EventValidationError only: the dotted path of the bad field (absent: the whole record)",
                examples=["messages.2.role"],
            ),
            SOURCE_TOPIC: _header("the topic the record was read from"),
            SOURCE_PARTITION: _header("its partition, decimal", pattern="^[0-9]+$"),
            SOURCE_OFFSET: _header("its offset, decimal", pattern="^[0-9]+$"),
            FAILED_AT: _header("when it was refused, ISO-8601 UTC with milliseconds", format="date-time"),
            SERVICE_VERSION: _header("the message-history version that refused it"),
        },
        "required": [ERROR_TYPE, ERROR_MESSAGE, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, FAILED_AT,
                     SERVICE_VERSION],
        "additionalProperties": True,
    }  # fmt: skip


def _channel(topic: str, setting: str, description: str, names: list[str]) -> dict[str, Any]:
    return {
        "address": topic,
        "description": f"{description} Topic name: `{setting}` (default `{topic}`).",
        "messages": {name: {"$ref": f"#/components/messages/{name}"} for name in names},
        "bindings": {"kafka": {"topic": topic, "bindingVersion": KAFKA_BINDING_VERSION}},
    }


def json_schemas() -> dict[str, str]:
    """File name -> content: one standalone JSON Schema (2020-12) per model."""
    files: dict[str, str] = {}
    for model in (*SCHEMA_MODELS, *OBSERVATIONAL_MODELS):
        schema = model.model_json_schema(mode="validation")
        schema["$schema"] = JSON_SCHEMA_DIALECT
        schema["$id"] = f"{model.__name__}.schema.json"
        files[f"{model.__name__}.schema.json"] = _dump(schema)
    return files


def asyncapi() -> dict[str, Any]:
    """The AsyncAPI 3.0 document: topics as channels, the service's operations, events as messages."""
    _, defs = models_json_schema(
        [(model, "validation") for model in (*SCHEMA_MODELS, *OBSERVATIONAL_MODELS)],
        ref_template="#/components/schemas/{model}",
    )
    limits = Limits()
    key = {"type": "string", "description": "threadId, UTF-8: one thread always lands on one partition"}
    messages: dict[str, Any] = {}
    command_key = {"type": "string", "description": "threadId (ForgetThread) or resourceId (ForgetResource)"}
    om_key = {"type": "string", "description": "threadId (thread scope) or resourceId (resource scope)"}
    for model in (*SCHEMA_MODELS[:4], *COMMAND_MODELS, *OBSERVATIONAL_MODELS):
        name = model.__name__
        messages[name] = {
            "name": name,
            "title": name,
            "summary": (model.__doc__ or "").strip().splitlines()[0],
            "contentType": "application/json",
            "payload": {"$ref": f"#/components/schemas/{name}"},
            "headers": _event_headers(),
            "bindings": {
                "kafka": {
                    "key": (
                        command_key
                        if model in COMMAND_MODELS
                        else om_key
                        if model in OBSERVATIONAL_MODELS
                        else key
                    ),
                    "bindingVersion": KAFKA_BINDING_VERSION,
                }
            },
        }
    messages["DeadLetter"] = {
        "name": "DeadLetter",
        "title": "DeadLetter",
        "summary": "A refused record: original key and value bytes, untouched; the reason is in the headers.",
        "payload": {"description": "the original record value, byte for byte (possibly not JSON at all)"},
        "headers": _dead_letter_headers(),
        "bindings": {
            "kafka": {
                "key": {"type": "string", "description": "the original record's key, untouched"},
                "bindingVersion": KAFKA_BINDING_VERSION,
            }
        },
    }
    channels: dict[str, Any] = {}
    inputs: dict[str, tuple[str, str]] = {}
    for channel, topic, setting, value_model, description in _TOPICS:
        models = value_model if isinstance(value_model, tuple) else (value_model,)
        channels[channel] = _channel(topic, setting, description, [m.__name__ for m in models])
        inputs[channel] = topic, setting
    for channel, what, _, _ in _DEAD_LETTERS:
        topic, setting = inputs[channel]
        channels[f"{channel}DeadLetters"] = _channel(
            f"{topic}.dlq",
            setting.removesuffix("_TOPIC") + "_DLQ_TOPIC",
            f"{what} the service refused: original key and value bytes, untouched; the reason in headers.",
            ["DeadLetter"],
        )
    operations: dict[str, Any] = {}
    for op_id, action, channel, summary in _OPERATIONS:
        operation: dict[str, Any] = {
            "action": action,
            "summary": summary,
            "channel": {"$ref": f"#/channels/{channel}"},
            "messages": [
                {"$ref": f"#/channels/{channel}/messages/{name}"} for name in channels[channel]["messages"]
            ],
        }
        if action == "receive":
            operation["bindings"] = {
                "kafka": {
                    "groupId": {"type": "string", "description": "MESSAGE_HISTORY_GROUP_ID",
                                "default": "message-history"},
                    "bindingVersion": KAFKA_BINDING_VERSION,
                }
            }  # fmt: skip
        operations[op_id] = operation
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "message-history",
            "version": f"{SCHEMA_VERSION}.0.0",
            "description": (
                "Conversation memory for AI agents as a Kafka stream: Mastra's MessageHistory over "
                "MongoDB. Records are UTF-8 JSON; messages are Mastra's MastraDBMessage (content format 2) "
                "and unknown fields are preserved. Per-thread order is Kafka's order (key = threadId). "
                "Delivery is at-least-once; eventId lets consumers drop duplicates. Default limits on input: "
                f"{limits.max_event_bytes} bytes per record, {limits.max_messages_per_event} messages per "
                f"list, {limits.max_parts_per_message} parts per message, {limits.max_id_length} characters "
                "per id. See docs/events.md."
            ),
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": defs["$defs"]},
    }


def render() -> dict[str, str]:
    """Every generated file: name -> exact content."""
    files = json_schemas()
    files[ASYNCAPI_FILE] = _dump(asyncapi())
    return files


def stale_files(out: Path) -> list[str]:
    """Names of files in `out` that are missing or differ from what the models generate."""
    stale = []
    for name, content in sorted(render().items()):
        path = out / name
        if not path.is_file() or path.read_text(encoding="utf-8") != content:
            stale.append(name)
    return stale


def write(out: Path) -> list[str]:
    """Write every generated file into `out`; returns the names that changed."""
    out.mkdir(parents=True, exist_ok=True)
    changed = stale_files(out)
    files = render()
    for name in changed:
        (out / name).write_text(files[name], encoding="utf-8")
    return changed


def main(out: str, check: bool) -> int:
    """`message-history schemas --out DIR [--check]`."""
    folder = Path(out)
    if check:
        stale = stale_files(folder)
        if stale:
            print(
                f"stale in {folder}: {', '.join(stale)} (run `message-history schemas --out {out}`)",
                file=sys.stderr,
            )
            return 1
        print(f"{folder}: up to date")
        return 0
    changed = write(folder)
    print(f"{folder}: {len(changed)} file(s) written" + (f" ({', '.join(changed)})" if changed else ""))
    return 0
