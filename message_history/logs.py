"""Structured logs: one JSON object per line, with secrets scrubbed before anything is written.

Each line has `ts` (ISO-8601 UTC, milliseconds), `level`, `logger`, `msg`, `trace_id` and `span_id` (hex, when
logged inside a recorded OpenTelemetry span), every field passed with `extra={...}`, and `exc` (the rendered
traceback) when there is one. Log aggregators (Loki, Cloud Logging,
Elasticsearch) parse these lines without configuration.

Scrubbing happens on every string that goes out (message, extra values, traceback), in this order:
1. values registered with `register_secret()` (the service registers `MONGODB_URI` and the Kafka SASL password
   at start; the password inside a registered URI is registered too);
2. the password in `scheme://user:password@host` URIs;
3. `password=...`, `"password": "..."` and the like (also `secret`, `passwd`, `api_key`), and any
   `extra` field whose name says it is one of those.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import traceback
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TextIO
from urllib.parse import unquote, urlsplit

from opentelemetry import trace
from pydantic import SecretStr

from message_history.log_quiet import QuietLines

if TYPE_CHECKING:
    from message_history.settings import Settings

MASK = "***"

QUIET_LOGGERS = ("aiokafka", "kafka", "pymongo")
"""Chatty client libraries, kept at WARNING or above unless asked otherwise."""

_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR}
_MIN_SECRET_LEN = 4  # shorter values would mask ordinary text everywhere and are no real secret

_secrets: set[str] = set()
_secrets_sorted: list[str] = []

# Every pattern here runs in time linear in the text, whatever the text (a log line can quote a client's id):
# each can start only where a scan cannot already be under way, and no two quantifiers can take the same
# character (tests/unit/test_regex_bounds.py feeds them adversarial input; the audit is in docs/security.md).
# - URI userinfo starts only right after `://` (a fixed-width lookbehind); the user part (possessive) stops
#   at `:` `/` `@`, the password part at `/`, so the scans of two URIs never overlap.
_URI_USERINFO = re.compile(r"(?<=[\w+.\-]://)(?P<user>[^:/@\s]*+):(?P<password>[^\s/?#]*)@")
# - A key starts only at the start of a run of name characters (the lookbehind), and is atomic: the run is
#   scanned once and never re-split between prefix, keyword and suffix.
_SENSITIVE_KEY = r"(?>[\w.\-]*(?:password|passwd|secret|api[_\-]?key)[\w.\-]*+)"
# - A quoted value is unambiguous: a backslash is only ever an escape, never an ordinary character (the
#   old `(?:\\.|(?!quote).)*` let each backslash be either, which backtracked exponentially on
#   `password="\\\\...`). A value whose quote does not close is masked to the end of its line.
_PAIR = re.compile(
    rf"""(?<![\w.\-])(?P<key>["']?{_SENSITIVE_KEY}["']?)(?P<sep>\s*+[:=]\s*+)"""
    r"""(?:(?P<quote>["'])(?:(?<=")(?:[^"\\\n]|\\.)*+|(?<=')(?:[^'\\\n]|\\.)*+)(?P<close>(?P=quote))?"""
    r"""|[^\s"',;&)}\]]++)""",
    re.IGNORECASE,
)
_SENSITIVE_NAME = re.compile(rf"^{_SENSITIVE_KEY}$", re.IGNORECASE)

MAX_SCRUB_CHARS: Final = 65_536
"""Longer text is cut (at the last whitespace before the cap, never inside a registered secret) before it is
scrubbed: a log line or dead-letter reason never needs more, and the work stays bounded."""
_CUT_SLACK: Final = 4096  # how far back a cut looks for whitespace, so it does not split a URI or a pair

# LogRecord attributes that are not `extra` fields.
_RESERVED = frozenset(logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def register_secret(value: str | SecretStr | None) -> None:
    """Never let `value` appear in a log line. For a URI, the password inside it is registered as well."""
    if value is None:
        return
    raw = value.get_secret_value() if isinstance(value, SecretStr) else value
    candidates = {raw}
    if "://" in raw:
        try:
            password = urlsplit(raw).password
        except ValueError:
            password = None
        if password:
            candidates |= {password, unquote(password)}
    added = {c for c in candidates if len(c) >= _MIN_SECRET_LEN} - _secrets
    if added:
        _secrets.update(added)
        # Longest first, so a URI is masked whole before its password alone is.
        _secrets_sorted[:] = sorted(_secrets, key=len, reverse=True)


def register_settings_secrets(settings: Settings) -> None:
    """Register every secret the settings hold (the MongoDB URI and its password, the SASL password)."""
    register_secret(settings.mongodb_uri)
    register_secret(settings.kafka_sasl_password)


def start_command(settings: Settings) -> None:
    """What every command does first: JSON logs at the configured level, with the settings' secrets masked."""
    configure_logging(settings.log_level)
    register_settings_secrets(settings)


def clear_secrets() -> None:
    """Forget every registered secret (tests)."""
    _secrets.clear()
    _secrets_sorted.clear()


def _mask_pair(match: re.Match[str]) -> str:
    quote = match.group("quote") or ""
    return f"{match.group('key')}{match.group('sep')}{quote}{MASK}{match.group('close') or ''}"


def _cut(text: str) -> str:
    """`text` within MAX_SCRUB_CHARS, with a note of what was cut; the cut splits no registered secret and,
    when it can, no word (half a URI or a `password=...` pair would not be recognised and masked)."""
    end = MAX_SCRUB_CHARS
    space = max(text.rfind(c, end - _CUT_SLACK, end) for c in " \t\n\r")
    end = space if space > 0 else end
    moved = True
    while moved:  # a secret that straddles the cut is cut before it (each pass moves the cut left)
        moved = False
        for secret in _secrets_sorted:
            at = text.find(secret, max(0, end - len(secret) + 1), end + len(secret) - 1)
            if at != -1:
                end, moved = at, True
    return f"{text[:end]} …[{len(text) - end} characters cut]"


def scrub(text: str) -> str:
    """`text` with registered secrets, URI passwords and `password=...`-style values masked (and cut to
    MAX_SCRUB_CHARS first). Linear in the text."""
    if len(text) > MAX_SCRUB_CHARS:
        text = _cut(text)
    for secret in _secrets_sorted:
        if secret in text:
            text = text.replace(secret, MASK)
    text = _URI_USERINFO.sub(lambda m: f"{m.group('user')}:{MASK}@", text)
    return _PAIR.sub(_mask_pair, text)


def _scrub_value(value: Any, depth: int = 0) -> Any:
    """JSON-ready copy of an `extra` value with every string scrubbed (and sensitive keys masked)."""
    result: Any
    if value is None or isinstance(value, bool | int | float):
        result = value
    elif isinstance(value, SecretStr):
        result = MASK
    elif depth < 8 and isinstance(value, dict):
        result = {
            str(k): (MASK if _SENSITIVE_NAME.match(str(k)) else _scrub_value(v, depth + 1))
            for k, v in value.items()
        }
    elif depth < 8 and isinstance(value, list | tuple | set | frozenset):
        result = [_scrub_value(v, depth + 1) for v in value]
    elif isinstance(value, datetime):
        result = value.isoformat()
    else:
        result = scrub(value if isinstance(value, str) else str(value))
    return result


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line, scrubbed (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        try:
            msg = record.getMessage()
        except (TypeError, ValueError):  # a bad format string must not lose the line
            msg = f"{record.msg!r} % {record.args!r}"
        ts = datetime.fromtimestamp(record.created, UTC)
        doc: dict[str, Any] = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": scrub(msg),
        }
        span = trace.get_current_span().get_span_context()
        if span.is_valid:  # inside a record's span (tracing on): the line joins its trace
            doc["trace_id"] = f"{span.trace_id:032x}"
            doc["span_id"] = f"{span.span_id:016x}"
        for key, value in record.__dict__.items():
            if key in _RESERVED:
                continue
            # An extra named like a base field ("ts", "level", ...) is kept under a suffixed name.
            name = f"{key}_" if key in doc or key in ("exc", "stack") else key
            doc[name] = MASK if _SENSITIVE_NAME.match(key) else _scrub_value(value)
        if record.exc_info and record.exc_info[0] is not None:
            doc["exc"] = scrub("".join(traceback.format_exception(*record.exc_info)).rstrip())
        elif record.exc_text:
            doc["exc"] = scrub(record.exc_text)
        if record.stack_info:
            doc["stack"] = scrub(record.stack_info)
        return json.dumps(doc, ensure_ascii=False, default=lambda v: scrub(str(v)))


class _JsonHandler(logging.StreamHandler[TextIO]):
    """Marks the handler this module installed, so a second `configure_logging` replaces it."""


def configure_logging(
    level: str, *, stream: TextIO = sys.stderr, quiet: Iterable[str] = QUIET_LOGGERS
) -> None:
    """Send every log record to `stream` as scrubbed JSON lines at `level` (DEBUG, INFO, WARNING, ERROR).

    Replaces the root logger's handlers (so calling it twice is safe). The `quiet` loggers are held at
    WARNING or above: their INFO chatter (connections, metadata refreshes) drowns the service's own lines.
    """
    numeric = _LEVELS.get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if isinstance(handler, _JsonHandler):
            handler.close()
    handler = _JsonHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(QuietLines())  # the drivers' per-attempt lines during an outage, rate-limited
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in quiet:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
    logging.captureWarnings(True)
