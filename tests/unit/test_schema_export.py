"""`message-history schemas`: the committed JSON Schemas and AsyncAPI document are current and complete."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path
from typing import Any

import pytest

from message_history.app.cli import main as cli_main
from message_history.settings import Settings
from schemas import export
from schemas.dead_letters import DEAD_LETTER_HEADERS, ERROR_PATH
from schemas.events import EVENT_TYPES
from schemas.messages import Message

COMMITTED = Path(__file__).parents[2] / "schemas" / "generated"


def test_committed_files_match_the_models(tmp_path: Path) -> None:
    """Regenerating into a fresh folder gives exactly the committed files (run `message-history schemas`)."""
    assert export.main(out=str(tmp_path), check=False) == 0
    generated = sorted(p.name for p in tmp_path.iterdir())
    assert generated == sorted(p.name for p in COMMITTED.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(tmp_path, COMMITTED, generated, shallow=False)
    assert (mismatch, errors) == ([], []), "stale: run `message-history schemas` and commit schemas/generated"
    assert match == generated


def test_check_passes_on_fresh_files_and_names_stale_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--check` exits 0 when current, 1 naming each stale or missing file otherwise."""
    assert cli_main(["schemas", "--out", str(tmp_path)]) == 0
    assert cli_main(["schemas", "--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "AgentRequest.schema.json").write_text("{}\n")
    (tmp_path / "asyncapi.json").unlink()
    capsys.readouterr()
    assert cli_main(["schemas", "--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "AgentRequest.schema.json" in err
    assert "asyncapi.json" in err
    assert "Message.schema.json" not in err
    assert export.write(tmp_path) == ["AgentRequest.schema.json", "asyncapi.json"]  # rewrites only those


def test_output_is_deterministic_sorted_and_newline_terminated() -> None:
    """Two renders are identical; every file is sorted-key JSON ending in one newline."""
    first, second = export.render(), export.render()
    assert first == second
    for name, text in first.items():
        assert text.endswith("}\n"), name
        assert not text.endswith("\n\n"), name
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n", name


def test_one_json_schema_per_event_and_message() -> None:
    """Each event and the message has a 2020-12 JSON Schema requiring the contract's fields."""
    files = export.json_schemas()
    models = (*export.SCHEMA_MODELS, *export.OBSERVATIONAL_MODELS)
    assert set(files) == {f"{m.__name__}.schema.json" for m in models}
    assert set(export.SCHEMA_MODELS) == {*EVENT_TYPES, Message, *export.COMMAND_MODELS}
    for model in EVENT_TYPES:
        schema = json.loads(files[f"{model.__name__}.schema.json"])
        assert schema["$schema"] == export.JSON_SCHEMA_DIALECT
        assert {"schemaVersion", "requestId", "threadId", "resourceId", "createdAt"} <= set(
            schema["required"]
        )
        assert schema["additionalProperties"] is True  # unknown fields are allowed and kept
    enriched = json.loads(files["EnrichedRequest.schema.json"])
    assert {"id", "createdAt", "threadId", "resourceId", "source"} <= set(
        enriched["$defs"]["EnrichedMessage"]["required"]
    )


def _asyncapi() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(export.render()[export.ASYNCAPI_FILE])
    return document


def _resolve(document: dict[str, Any], ref: str) -> Any:
    node: Any = document
    for key in ref.removeprefix("#/").split("/"):
        node = node[key]
    return node


def test_asyncapi_describes_every_topic_of_the_contract() -> None:
    """AsyncAPI 3.0 lists the six topics at their default names (the Settings defaults), with messages."""
    document = _asyncapi()
    settings = Settings()
    assert document["asyncapi"] == "3.0.0"
    addresses = {c["address"]: set(c["messages"]) for c in document["channels"].values()}
    assert addresses == {
        settings.requests_topic: {"AgentRequest"},
        settings.enriched_topic: {"EnrichedRequest"},
        settings.responses_topic: {"AgentResponse"},
        settings.persisted_topic: {"HistoryPersisted"},
        settings.requests_dlq: {"DeadLetter"},
        settings.responses_dlq: {"DeadLetter"},
        settings.commands_topic: {"ForgetThread", "ForgetResource"},
        settings.forgotten_topic: {"HistoryForgotten"},
        settings.commands_dlq: {"DeadLetter"},
        settings.observe_requests_topic: {"ObserveRequest", "ReflectRequest"},
        settings.observe_results_topic: {"ObserveResult", "ReflectResult"},
        settings.observe_results_dlq: {"DeadLetter"},
    }
    actions = {
        (op["action"], _resolve(document, op["channel"]["$ref"])["address"])
        for op in document["operations"].values()
    }
    assert actions == {
        ("receive", "agent.requests"),
        ("send", "agent.requests.enriched"),
        ("receive", "agent.responses"),
        ("send", "agent.history.persisted"),
        ("send", "agent.requests.dlq"),
        ("send", "agent.responses.dlq"),
        ("receive", "agent.history.commands"),
        ("send", "agent.history.forgotten"),
        ("send", "agent.history.commands.dlq"),
        ("send", "agent.memory.observe"),
        ("receive", "agent.memory.observed"),
        ("send", "agent.memory.observed.dlq"),
    }


def test_asyncapi_references_all_resolve() -> None:
    """Every `$ref` in the AsyncAPI document points at something inside it."""
    document = _asyncapi()
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    assert len(refs) > 20
    for ref in refs:
        assert ref.startswith("#/")
        _resolve(document, ref)  # KeyError if dangling


def test_asyncapi_messages_carry_key_and_headers() -> None:
    """Events are keyed by threadId and carry traceparent; dead letters list every dead-letter header."""
    messages = _asyncapi()["components"]["messages"]
    for model in EVENT_TYPES:
        message = messages[model.__name__]
        assert "threadId" in message["bindings"]["kafka"]["key"]["description"]
        assert "traceparent" in message["headers"]["properties"]
        assert message["payload"] == {"$ref": f"#/components/schemas/{model.__name__}"}
    dead = messages["DeadLetter"]["headers"]
    assert set(DEAD_LETTER_HEADERS) | {"traceparent"} <= set(dead["properties"])
    assert set(dead["required"]) == set(DEAD_LETTER_HEADERS) - {ERROR_PATH}
