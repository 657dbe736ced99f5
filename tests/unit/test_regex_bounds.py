"""No regular expression in product code can backtrack super-linearly (issue 31: a 26-character message id
froze the service in the log scrubber's regex).

Every compiled pattern of the product packages is found by importing them, must be in the audited list
below (a new one is audited, docs/security.md), and is fed inputs sized to expose super-linear cost: 64 KB
of backslashes, `password="` and 64 K backslashes, long runs of every character class the patterns repeat,
and repetitions of their literals. The timeouts are hang guards, not timing assertions: a linear pattern
takes milliseconds per input, a quadratic one minutes, an exponential one forever.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from message_history.errors import MessageIdTakenError
from message_history.logs import MASK, MAX_SCRUB_CHARS, clear_secrets, register_secret, scrub
from schemas.dead_letters import MAX_MESSAGE_BYTES, error_message

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("message_history", "consumers", "producers", "schemas", "storage", "worker")

AUDITED = {
    "message_history.app.prune._DURATION",
    "message_history.core.observation_dates._HEADER",
    "message_history.core.observation_dates._INTENT",
    "message_history.core.observation_dates._RANGE",
    "message_history.core.observation_dates._SIMPLE",
    "message_history.core.observation_dates._WILL",
    "message_history.core.observation_resource._DATE",
    "message_history.core.observation_resource._THREAD_OPEN",
    "message_history.core.observation_resource._THREAD_TAG",
    "message_history.core.observation_text._ANCHOR",
    "message_history.core.observer_parts._IDENTIFIER",
    "message_history.core.observer_parts._QUOTE_SAFE",
    "message_history.core.observer_parts._SCHEME",
    "message_history.core.observer_parts._SURROGATE",
    "message_history.core.observation_text._BOUNDARY",
    "message_history.core.observation_text._GREEN",
    "message_history.core.observation_text._NEWLINES",
    "message_history.core.observation_text._SPACES",
    "message_history.core.observation_text._YELLOW",
    "message_history.core.tokens._ASCII_LONG_WORD",
    "message_history.core.tokens._ASCII_WORD",
    "message_history.core.tokens._CJK",
    "message_history.core.tokens._HAS_PUNCTUATION",
    "message_history.core.tokens._NUMERIC",
    "message_history.core.tokens._PUNCTUATION_RUN",
    "message_history.core.tokens._SPLIT",
    "message_history.core.tokens._URL_SCHEME",
    "message_history.core.tokens._WHITESPACE",
    "message_history.logs._PAIR",
    "message_history.logs._SENSITIVE_NAME",
    "message_history.logs._URI_USERINFO",
    "schemas.canonical._DATA_TYPE",
    "schemas.codec._MAYBE_HUGE",
}

N = 65_536


def _product_patterns() -> dict[str, re.Pattern[Any]]:
    found: dict[str, re.Pattern[Any]] = {}
    for package in PRODUCT:
        root = importlib.import_module(package)
        walked = pkgutil.walk_packages(root.__path__, f"{package}.")
        names = [package, *(info.name for info in walked if "__main__" not in info.name)]
        for name in names:
            module = importlib.import_module(name)
            for attr, value in vars(module).items():
                if isinstance(value, re.Pattern):
                    found.setdefault(f"{name}.{attr}", value)
    return found


PATTERNS = _product_patterns()


def _adversarial() -> list[str]:
    runs = "a1 .,\n\t\"':/@e-_=\\#?&)}]数é\u2028"
    literals = [
        "a.",
        "1,",
        "1.",
        "a:",
        "://",
        "a.a://",
        "x://u:",
        "e1",
        "e+",
        "password",
        "password=",
        'password="',
        "password='",
        "password:\"'",
        "secret_",
        "apikey",
        "data-",
        "aaaaaa ",
        "1" * 299 + ",",
        '\\"',
    ]
    inputs = ["\\" * N, 'password="' + "\\" * N, 'password="' + "\\" * N + '"', "password" + " " * N + "x"]
    inputs += [char * N for char in runs]
    inputs += [(lit * (N // len(lit) + 1))[:N] for lit in literals]
    return inputs


INPUTS = _adversarial()


def test_every_product_pattern_is_audited() -> None:
    """A pattern added to product code fails here until it is audited (linear by construction) and listed."""
    assert set(PATTERNS) == AUDITED


def test_patterns_are_compiled_at_module_level() -> None:
    """Product code calls `re` only to compile at module level, so the audit above sees every pattern."""
    stray: list[str] = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            top_level = {id(node.value) for node in tree.body if isinstance(node, ast.Assign | ast.AnnAssign)}
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "re"
                    and not (node.func.attr == "compile" and id(node) in top_level)
                ):
                    stray.append(f"{path.relative_to(ROOT)}:{node.lineno} re.{node.func.attr}")
    assert stray == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(AUDITED))
def test_pattern_is_linear_on_adversarial_input(name: str) -> None:
    """Every way the product uses a pattern (scan, anchored match, whole match) finishes on every input."""
    pattern = PATTERNS[name]
    for text in INPUTS:
        subject: Any = text.encode() if isinstance(pattern.pattern, bytes) else text
        for _ in pattern.finditer(subject):  # what search, sub, split and findall do from every start
            pass
        pattern.match(subject)
        pattern.fullmatch(subject)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "text",
    [*INPUTS[:4], "password" * (N // 8), "a." * (N // 2), "a" * 4 * N],
    ids=["backslashes", "open-quote", "closed-quote", "spaces", "keywords", "dotted", "over-cap"],
)
def test_scrub_finishes_and_is_capped(text: str) -> None:
    """The scrubber on adversarial text (and 4x its cap) finishes, and its output stays near the cap."""
    assert len(scrub(text)) <= MAX_SCRUB_CHARS + 64


@pytest.mark.timeout(60)
def test_dead_letter_of_a_hostile_message_id_finishes() -> None:
    """Issue 31's example: a `MessageIdTakenError` for a `password="` + backslashes id becomes a dead letter's
    reason at once, with the would-be secret masked."""
    for n in (16, 64, N):
        error = MessageIdTakenError("thread-1", "resource-1", 'password="' + "\\" * n)
        message = error_message(error)
        assert len(message) <= MAX_MESSAGE_BYTES
        assert b"\\\\\\\\" not in message
        assert MASK.encode() in message


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ('a password="abc\\" def" b', 'a password="***" b'),  # an escaped quote does not end the value
        ('password="unterminated value', 'password="***'),  # to the end of the line when it never closes
        ("password='x\ny' z", "password='***\ny' z"),  # a value never spans lines
        ('password="' + "\\" * 20, 'password="***'),
        ("token at 1://u:pw@host", "token at 1://u:***@host"),  # any scheme character before `://`
        ("xpassword-file=abc", "xpassword-file=***"),  # the key is the whole run of name characters
    ],
)
def test_scrub_quoted_values(text: str, masked: str) -> None:
    """The unambiguous quoted branch masks what the old one did, and more: never less."""
    assert scrub(text) == masked


def test_cut_never_splits_a_registered_secret() -> None:
    """A registered secret that straddles the cap is cut before, not in the middle (its head would leak)."""
    clear_secrets()
    try:
        secret = "s3cr3t-" + "k" * 40
        register_secret(secret)
        text = "x" * (MAX_SCRUB_CHARS - 10) + secret + " tail"
        out = scrub(text)
        assert "s3cr3t" not in out
        assert out.startswith("x" * 100)
        assert "characters cut]" in out
    finally:
        clear_secrets()


# The scrubber's patterns before issue 31, kept to show the guard above can fail: the quoted branch let a
# backslash be an escape or an ordinary character (exponential), the key re-split its run at every start
# (quadratic and worse).
_OLD_KEY = r"[\w.\-]*(?:password|passwd|secret|api[_\-]?key)[\w.\-]*"
_OLD_PAIR = (
    rf"""(?P<key>["']?{_OLD_KEY}["']?)(?P<sep>\s*[:=]\s*)"""
    r"""(?:(?P<quote>["'])(?:\\.|(?!(?P=quote)).)*(?P=quote)|[^\s"',;&)}\]]+)"""
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "text",
    ['message id password="' + "\\" * 64 + " is taken", "password" * 8192],
    ids=["backslashes", "keywords"],
)
def test_old_scrubber_pattern_hangs(text: str) -> None:
    """The old pattern does not finish these in 5 s (it needs minutes, or ages); the new one finishes."""
    program = f"import re; re.compile({_OLD_PAIR!r}, re.IGNORECASE).sub('', {text!r})"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", program], timeout=5, check=False)
    scrub(text)
