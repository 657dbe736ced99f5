"""Every error a command prints goes through the logs' one scrubber: a password in a driver's message (a
MongoDB URI, say) never reaches the terminal, a CI log or a Job's output."""

from __future__ import annotations

import argparse
import ast
import asyncio
import io
from pathlib import Path
from typing import Any, NoReturn

import pytest
from aiokafka.errors import KafkaConnectionError

from message_history.app import dlq, prune, topics
from message_history.app.cli import main as cli_main
from message_history.app.dlq_plan import add_dlq_arguments
from message_history.errors import MessageHistoryError
from message_history.settings import Settings

APP = Path(__file__).resolve().parents[2] / "message_history" / "app"
PASSWORD = "Pw-4-unit-tests"
URI = f"mongodb://svc:{PASSWORD}@db.internal:27017/?authSource=admin"
# Calls that put text in front of a person: an exception in their arguments must be inside scrub(...).
OUTPUT_CALLS = frozenset({"print", "exit", "write"})


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _unscrubbed(node: ast.AST, name: str) -> bool:
    """Whether `name` is used in `node` other than inside `scrub(...)` (or `type(...)`: a class name)."""
    if isinstance(node, ast.Call) and _callee(node) in ("scrub", "type"):
        return False
    if isinstance(node, ast.Name) and node.id == name:
        return True
    return any(_unscrubbed(child, name) for child in ast.iter_child_nodes(node))


def _unscrubbed_prints(path: Path) -> list[int]:
    """Lines where an exception caught `as NAME` reaches an output call other than through `scrub(...)`."""
    found = []
    for handler in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(handler, ast.ExceptHandler) or handler.name is None:
            continue
        for node in ast.walk(handler):
            if isinstance(node, ast.Call) and _callee(node) in OUTPUT_CALLS:
                arguments = [*node.args, *(k.value for k in node.keywords)]
                if any(_unscrubbed(arg, handler.name) for arg in arguments):
                    found.append(node.lineno)
    return found


def test_no_command_prints_an_exception_unscrubbed() -> None:
    """In message_history/app, an exception caught with `as NAME` reaches print/sys.exit/.write only through
    `scrub(...)` (str(exc) of a driver error may quote a connection string with its password)."""
    files = sorted(APP.rglob("*.py"))
    assert len(files) > 10
    hits = [f"{path.relative_to(APP)}:{line}" for path in files for line in _unscrubbed_prints(path)]
    assert hits == []


def test_the_guard_sees_an_unscrubbed_print(tmp_path: Path) -> None:
    """The check above flags the shapes it is meant to (so its silence means something)."""
    path = tmp_path / "sample.py"
    path.write_text(
        "try:\n    pass\nexcept OSError as exc:\n"
        "    print(f'failed: {exc!r}', file=err)\n"
        "    print(f'fine: {scrub(str(exc))}')\n"
        "    sys.exit(str(exc))\n"
        "    err.write(type(exc).__name__ + exc.args[0])\n"
    )
    assert _unscrubbed_prints(path) == [4, 6, 7]


# --- the commands themselves -----------------------------------------------------------------------------


def _raise(exc: BaseException) -> Any:
    async def fail(*_: object, **__: object) -> NoReturn:
        raise exc

    return fail


def test_prune_failure_hides_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(prune, "run_prune", _raise(MessageHistoryError(f"cannot reach {URI}")))
    assert asyncio.run(prune._main(Settings(), argparse.Namespace())) == 1
    err = capsys.readouterr().err
    assert "cannot reach mongodb://svc:***@db.internal" in err
    assert PASSWORD not in err


def test_topics_failure_hides_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(topics, "ensure_topics", _raise(KafkaConnectionError(f"sasl via {URI}")))
    assert topics.main(partitions=None, replication=1) == 1
    err = capsys.readouterr().err
    assert "FAIL kafka" in err
    assert PASSWORD not in err


def test_dlq_failure_hides_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dlq, "collect", _raise(KafkaConnectionError(f"proxy {URI}")))
    parser = argparse.ArgumentParser()
    add_dlq_arguments(parser)
    options = dlq.options_from_args(parser.parse_args(["inspect"]), Settings())
    out, err = io.StringIO(), io.StringIO()
    assert asyncio.run(dlq.run_dlq(Settings(), options, stop=asyncio.Event(), out=out, err=err)) == 1
    assert "Kafka failed" in err.getvalue()
    assert PASSWORD not in err.getvalue() + out.getvalue()


def test_forget_failure_hides_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from storage.forgetting import MongoForgetting  # noqa: PLC0415

    monkeypatch.setattr(MongoForgetting, "forget_resource", _raise(MessageHistoryError(f"auth {URI}")))
    monkeypatch.setenv("MONGODB_URI", "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=100")
    assert cli_main(["forget", "--resource", "r-1"]) == 1
    err = capsys.readouterr().err
    assert "message-history forget: auth mongodb://svc:***@" in err
    assert PASSWORD not in err
