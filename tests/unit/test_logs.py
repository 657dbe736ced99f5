"""JSON-lines logging: shape of each line, extras, exceptions, and that secrets never reach the output."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from message_history.logs import MASK, clear_secrets, configure_logging, register_secret, scrub
from message_history.settings import Settings

SECRET = "s3cr3t-Pa55w0rd!"


@pytest.fixture
def out() -> Iterator[io.StringIO]:
    """Logging configured into a buffer; the root logger and the secret registry are restored afterwards."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    quiet_levels = {name: logging.getLogger(name).level for name in ("aiokafka", "kafka", "pymongo")}
    buffer = io.StringIO()
    configure_logging("DEBUG", stream=buffer)
    yield buffer
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved_handlers:
        root.addHandler(handler)
    root.setLevel(saved_level)
    for name, level in quiet_levels.items():
        logging.getLogger(name).setLevel(level)
    logging.captureWarnings(False)
    clear_secrets()


class Opaque:
    def __str__(self) -> str:
        return "opaque-thing"


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_each_record_is_one_json_line_with_base_fields(out: io.StringIO) -> None:
    """Every record becomes one JSON object with ts, level, logger and the formatted msg."""
    log = logging.getLogger("message_history.test")
    log.info("hello %s", "world")
    log.warning("multi\nline")
    records = lines(out)
    assert len(records) == 2
    assert records[0]["level"] == "INFO"
    assert records[0]["logger"] == "message_history.test"
    assert records[0]["msg"] == "hello world"
    assert records[0]["ts"].endswith("Z")
    assert len(records[0]["ts"]) == len("2025-01-01T00:00:00.000Z")
    assert records[1]["msg"] == "multi\nline"


def test_extras_are_top_level_fields(out: io.StringIO) -> None:
    """Fields passed with extra= appear as JSON fields, non-JSON values as text, clashing names suffixed."""
    logging.getLogger("t").info(
        "batch done",
        extra={
            "partition": 3,
            "records": [1, 2],
            "topic": "agent.requests",
            "ok": True,
            "level": "x",
            "obj": Opaque(),
        },
    )
    (record,) = lines(out)
    assert record["partition"] == 3
    assert record["records"] == [1, 2]
    assert record["topic"] == "agent.requests"
    assert record["ok"] is True
    assert record["level"] == "INFO"
    assert record["level_"] == "x"
    assert record["obj"] == "opaque-thing"


def test_exception_is_rendered(out: io.StringIO) -> None:
    """log.exception adds the traceback text under exc."""
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("t").exception("failed")
    (record,) = lines(out)
    assert record["msg"] == "failed"
    assert "Traceback" in record["exc"]
    assert "RuntimeError: boom" in record["exc"]


def test_level_filters_and_quiet_loggers(out: io.StringIO) -> None:
    """Records below the level are dropped and client libraries are held at WARNING."""
    configure_logging("WARNING", stream=out)
    logging.getLogger("t").info("dropped")
    logging.getLogger("aiokafka.conn").info("chatter")
    logging.getLogger("t").warning("kept")
    assert [r["msg"] for r in lines(out)] == ["kept"]
    configure_logging("DEBUG", stream=out)
    logging.getLogger("pymongo.topology").info("still quiet")
    assert [r["msg"] for r in lines(out)] == ["kept"]


def test_configure_twice_does_not_duplicate_lines(out: io.StringIO) -> None:
    """Calling configure_logging again replaces its handler instead of adding a second one."""
    configure_logging("INFO", stream=out)
    logging.getLogger("t").info("once")
    assert [r["msg"] for r in lines(out)] == ["once"]


def test_unknown_level_is_refused() -> None:
    """An unknown level name raises instead of silently logging everything."""
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("LOUD", stream=io.StringIO())


@pytest.mark.parametrize(
    ("text", "leak", "kept"),
    [
        ("connecting to mongodb://app:hunter22@db:27017/mastra", "hunter22", "mongodb://app:***@db:27017"),
        ("mongodb+srv://app:p%40ss@cluster0.x.net/?w=majority", "p%40ss", "mongodb+srv://app:***@cluster0"),
        ("broker sasl_ssl://svc:pw-with@sign@kafka:9093 ok", "pw-with", "sasl_ssl://svc:***@kafka:9093 ok"),
        ("password=hunter22 user=app", "hunter22", "password=*** user=app"),
        ('{"password": "hunter22", "user": "app"}', "hunter22", '"password": "***"'),
        ("{'sasl_plain_password': 'hunter22'}", "hunter22", "'sasl_plain_password': '***'"),
        ("kafka_sasl_password=hunter22, next", "hunter22", "kafka_sasl_password=***, next"),
        ("client_secret: hunter22", "hunter22", "client_secret: ***"),
        ("API_KEY=hunter22", "hunter22", "API_KEY=***"),
    ],
    ids=[
        "mongodb-uri",
        "srv-uri-encoded",
        "kafka-url-at-in-password",
        "kv",
        "json",
        "py-repr",
        "setting",
        "colon",
        "api-key",
    ],
)
def test_scrub_patterns(text: str, leak: str, kept: str) -> None:
    """URI passwords and password-like key/value pairs are masked; the rest of the text stays readable."""
    masked = scrub(text)
    assert leak not in masked
    assert kept in masked


@pytest.mark.parametrize(
    "text",
    ["mongodb://db:27017/mastra", "max_tokens=1000 partition=3", "http://host/path?x=1", "a: b"],
    ids=["uri-without-userinfo", "ordinary-kv", "url", "ordinary-colon"],
)
def test_scrub_leaves_ordinary_text_alone(text: str) -> None:
    """Text without secrets passes through unchanged."""
    assert scrub(text) == text


def test_registered_secret_never_appears(out: io.StringIO) -> None:
    """A registered secret is masked in the message, in extras (nested too) and in exception text."""
    register_secret(SecretStr(SECRET))
    log = logging.getLogger("t")
    log.info("using %s now", SECRET)
    log.info("context", extra={"detail": f"x{SECRET}y", "nested": {"list": [SECRET]}, "plain": SECRET})
    try:
        raise ConnectionError(f"auth failed for {SECRET}")
    except ConnectionError:
        log.exception("connect failed")
    text = out.getvalue()
    assert SECRET not in text
    assert text.count(MASK) >= 5
    assert len(lines(out)) == 3


def test_registered_uri_masks_its_password_alone(out: io.StringIO) -> None:
    """Registering a URI also masks its password when the password shows up on its own."""
    uri = "mongodb://app:Zx9%2Fq-long@db.internal:27017/?authSource=admin"
    register_secret(uri)
    log = logging.getLogger("t")
    log.info("uri %s", uri)
    log.info("password alone: %s and decoded %s", "Zx9%2Fq-long", "Zx9/q-long")
    text = out.getvalue()
    assert "Zx9" not in text
    assert "db.internal" not in lines(out)[0]["msg"]  # the whole registered URI is masked


def test_sensitive_extra_names_are_masked(out: io.StringIO) -> None:
    """Extras named like passwords are masked whatever their value, and SecretStr values never print."""
    logging.getLogger("t").info(
        "cfg",
        extra={
            "mongodb_password": "plain-text-value",
            "token_count": 12,
            "cfg": {"password": "v4lue"},
            "sec": SecretStr("zzzz-hidden"),
        },
    )
    (record,) = lines(out)
    assert record["mongodb_password"] == MASK
    assert record["cfg"] == {"password": MASK}
    assert record["token_count"] == 12
    assert record["sec"] == MASK
    assert "plain-text-value" not in out.getvalue()
    assert "zzzz-hidden" not in out.getvalue()


def test_settings_dump_leaks_nothing(out: io.StringIO) -> None:
    """Logging the whole settings object (repr and dict) does not reveal the MongoDB URI or SASL password."""
    settings = Settings(
        mongodb_uri=SecretStr("mongodb://svc:Mongo-Pw-123@db:27017"),
        kafka_sasl_password=SecretStr("Sasl-Pw-456"),
    )
    assert "Mongo-Pw-123" in settings.mongodb_uri.get_secret_value()  # the override took effect
    register_secret(settings.mongodb_uri)
    register_secret(settings.kafka_sasl_password)
    log = logging.getLogger("t")
    log.info("settings %r", settings)
    log.info("settings", extra={"settings": settings.model_dump()})
    log.info("raw %s %s", settings.mongodb_uri.get_secret_value(), "Sasl-Pw-456")
    text = out.getvalue()
    assert "Mongo-Pw-123" not in text
    assert "Sasl-Pw-456" not in text
    assert len(lines(out)) == 3


def test_short_values_are_not_registered(out: io.StringIO) -> None:
    """Values too short to be secrets are ignored so ordinary text is not shredded."""
    register_secret("ab")
    register_secret(None)
    register_secret("")
    logging.getLogger("t").info("abba cab")
    assert lines(out)[0]["msg"] == "abba cab"
