"""Messages and observation texts whose Observational Memory token counts Mastra itself computed.

`tests/data/om/mastra_om.json` holds Mastra's answers for these inputs (`@mastra/memory` 1.31.0 under Node,
recorded by `python -m tests.om_cases record`); `tests/unit/test_om_tokens.py` checks the Python counter
against them without Node, `tests/interop/test_mastra_om_interop.py` checks the recording against live Mastra.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
RECORDING: Final = ROOT / "tests" / "data" / "om" / "mastra_om.json"
NODE_DIR: Final = ROOT / "tests" / "interop" / "mastra-om"


def _msg(role: str, *parts: Any, content: Any = None, **extra: Any) -> dict[str, Any]:
    body = content if content is not None else {"format": 2, "parts": list(parts)}
    return {
        "id": f"m{len(MESSAGES)}",
        "role": role,
        "createdAt": "2025-01-01T00:00:00.000Z",
        "content": body,
        **extra,
    }


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _tool(state: str, **fields: Any) -> dict[str, Any]:
    return {"type": "tool-invocation", "toolInvocation": {"state": state, "toolCallId": "c1", **fields}}


MESSAGES: list[dict[str, Any]] = []
_SPECS: Final[list[tuple[str, tuple[Any, ...], dict[str, Any]]]] = [
    ("user", (_text("hello world"),), {}),
    ("assistant", (_text("Hi! How can I help you today? I'm a helpful assistant."),), {}),
    ("user", (_text(""),), {}),
    ("user", (_text("Größe, café, naïve: ünïcödé and 日本語のテキスト, emoji 🎉🎉 and ∑ math"),), {}),
    ("user", (_text("a" * 5000),), {}),
    ("assistant", (_text("one"), _text("two three"), {"type": "step-start"}), {}),
    ("assistant", (_tool("call", toolName="weather", args={"city": "Paris", "days": 3}),), {}),
    ("assistant", (_tool("call", toolName="search", args="raw string args"),), {}),
    ("assistant", (_tool("partial-call", toolName="search"),), {}),
    (
        "assistant",
        (
            _tool(
                "result",
                toolName="weather",
                args={"city": "Paris"},
                result={"temp": 21.5, "sky": "clear", "hours": [1, 2, 3], "nested": {}},
            ),
        ),
        {},
    ),
    ("assistant", (_tool("result", toolName="echo", args={}, result="plain string result"),), {}),
    ("assistant", (_tool("result", toolName="echo", args={}, result="   "),), {}),
    ("assistant", (_tool("result", toolName="echo", args={}),), {}),
    ("assistant", (_tool("result", toolName="echo", args={}, isError=True, errorText="boom: failed"),), {}),
    ("assistant", (_tool("result", toolName="echo", args={}, result=None),), {}),
    (
        "assistant",
        (
            _tool(
                "result", toolName="enc", args={"q": 1}, result={"encryptedContent": "x" * 300, "short": "y"}
            ),
        ),
        {},
    ),
    ("assistant", (_tool("output-error", toolName="t", args={"a": [1, 2]}, errorText="   "),), {}),
    (
        "assistant",
        (
            _tool(
                "output-denied",
                toolName="t",
                args={"a": True},
                approval={"id": "a1", "approved": False, "reason": "not now"},
            ),
        ),
        {},
    ),
    ("assistant", (_tool("output-denied", toolName="t", args={"a": True}),), {}),
    (
        "assistant",
        (
            _tool(
                "approval-responded",
                toolName="t",
                args={"x": None},
                approval={"id": "a1", "approved": True, "reason": "ok go"},
            ),
        ),
        {},
    ),
    ("assistant", (_tool("approval-requested", toolName="t", args={"x": 1e21, "y": 0.1, "z": -0.0}),), {}),
    (
        "assistant",
        (
            {
                "type": "tool-invocation",
                "toolInvocation": {
                    "state": "result",
                    "toolCallId": "c2",
                    "toolName": "m",
                    "args": {},
                    "result": {"raw": 1},
                },
                "providerMetadata": {"mastra": {"modelOutput": {"type": "text", "value": "model sees this"}}},
            },
        ),
        {},
    ),
    (
        "assistant",
        ({"type": "reasoning", "reasoning": "thinking hard", "details": [{"type": "text", "text": "x"}]},),
        {},
    ),
    ("assistant", ({"type": "data-progress", "data": {"pct": 50}},), {}),
    (
        "assistant",
        ({"type": "source", "source": {"sourceType": "url", "id": "s1", "url": "https://example.com/a"}},),
        {},
    ),
    (
        "user",
        (
            {
                "type": "text",
                "text": "cached",
                "providerMetadata": {
                    "mastra": {
                        "tokenEstimate": {"v": 7, "source": "v7:tokenx", "key": "text:zz", "tokens": 999}
                    }
                },
            },
        ),
        {},
    ),
    (
        "assistant",
        (
            {
                "type": "step-start",
                "providerMetadata": {
                    "mastra": {"tokenEstimate": {"v": 7, "source": "x", "key": "k", "tokens": 3}},
                    "other": {"a": 1},
                },
            },
        ),
        {},
    ),
    ("user", (), {"content": {"format": 2, "parts": [], "content": "legacy content string"}}),
    ("user", (), {"content": {"format": 2, "content": "only content, no parts"}}),
    ("system", (_text("You are a system prompt."),), {}),
    (
        "user",
        (
            {
                "type": "file",
                "data": "https://example.com/report.pdf",
                "mimeType": "application/pdf",
                "filename": " report.pdf ",
            },
        ),
        {},
    ),
    (
        "user",
        (
            {
                "type": "file",
                "data": "https://example.com/x",
                "mimeType": "image/png",
                "providerMetadata": {
                    "mastra": {"tokenEstimate": {"v": 0, "source": "client", "key": "client", "tokens": 1234}}
                },
            },
        ),
        {},
    ),
    ("user", (_text("x"),) * 7, {}),
    ("assistant", (_text("line1\n\nline2\t\ttabs   spaces"), _text("--- *** ///  !!! ???")), {}),
]
for _role, _parts, _extra in _SPECS:
    MESSAGES.append(_msg(_role, *_parts, **_extra))

OBSERVATIONS: Final[list[str]] = [
    "",
    "Date: Jan 1, 2025\n* 🔴 (14:30) User prefers Python [preference, language]\n"
    "* 🟡 (14:31) User asked -> about Kafka",
    "* 🟢 low priority note   with   spaces\n\n\n\n* [72 items collapsed - ID: b1fa] kept\n* see [docs](https://x.y/z)",
    "日本語 observation 🎉 with unicode",
    "[O1] first\n  [O1-N2] nested",
    "a [tag] b [72 items collapsed - ID: x] c [link](u) d [] e [ 3 items collapsed]",
    "a [[b] c [x\ny] z",
    "x\u2028->\u2028y --> w",
    "\ufeff text \ufeff",
    "one\n\n--- message boundary (2025-01-01T12:00:00.000Z) ---\n\n\ntwo",
]


_DAYS: Final = [
    "Jan 1, 2020", "June 20, 2023", "June 19, 2023", "June 17, 2023", "June 12, 2023", "June 5, 2023",
    "May 20, 2023", "Jan 2, 2023", "Jan 1, 2021", "June 21, 2023", "June 24, 2023", "June 28, 2023",
    "July 5, 2023", "August 1, 2023", "Dec 25, 2023", "June 30, 2024", "Jan 1, 2030",
]  # fmt: skip
CONTEXT_CASES: Final[list[dict[str, str]]] = [
    {"observations": "", "now": "2023-06-20T10:00:00.000Z"},
    {
        "observations": "Date: May 15, 2023\n* 🔴 hi\nDate: June 1, 2023\n* x",
        "now": "2023-06-20T10:00:00.000Z",
    },
    {
        "observations": "\n".join(f"Date: {d}\n* 🟡 (09:00) seen [tag] -> ok" for d in _DAYS),
        "now": "2023-06-20T23:59:59.999Z",
    },
    {
        "observations": (
            "Date: Febr 30, 2023\n* rolled\nDate: Foo 1, 2023\n* not a month\nDate: Mon 5, 2023\n* weekday\n"
            "Date: Jan 5, 0049\n* two-digit\nDate: Jan 0, 2023\n* day zero\nDate: Mayo 3, 2023\n* prefix\n"
            "x Date: May 1, 2023\nDate: May 2, 2023 trailing\nDate:\n\tMay 3, 2023\r\n"
            "Date:May 4, 2023\u2028* sep"
        ),
        "now": "2023-05-10T00:00:00.000Z",
    },
    {
        "observations": (
            "Date: Jan 1, 2025\n* a\n\n--- message boundary (2025-01-02T00:00:00.000Z) ---\n\n"
            "Date: Jan 3, 2025\n* b\n\n\n\nDate: March 9, 2025\n* c"
        ),
        "now": "2025-03-10T08:00:00.000Z",
    },
    {
        "observations": (
            "Date: June 1, 2023\n"
            "* User will start a diet (meaning May 30, 2023)\n"
            "* User said it was cold (meaning May 29, 2023) then (estimated May 27-28, 2023)\n"
            "* User plans to travel (estimated late April 2023) and (ESTIMATED mid-to-late May 2023)\n"
            "* Trip (estimated April to early May 2023) (meaning april to early 2023) (meaning Foo 1, 2023)\n"
            "* Wants to move (MEANING  2023) (meaning   2024) (meaning July 4, 2023) (estimated no digits)\n"
            "* plans tomorrow (meaning Jan 3, 2023) planning to (meaning Feb 30, 2023)"
            " willow (meaning Mar 1, 2023)\n"
            "* needs to (meaning (meaning Mar 2, 2023) nested) earlymay 2023 (estimated earlymay 2023)\n"
            "* Going to (meaning Dec 1, 2024) and about to\n(meaning Jan 2, 2023)"
            " (estimated midtolatejune 2023)\n"
            "* will\n(meaning Jan 5, 2023) will go (meaning Jan 6, 2023) (estimated x May to Jun 2023)\n"
            "Date: June 10, 2023\n* done (meaning   June 9, 2023)"
        ),
        "now": "2023-06-12T12:00:00.000Z",
    },
]


def run_mastra(command: str, payload: dict[str, Any], *, zone: str = "UTC") -> dict[str, Any]:
    """`node om.mjs <command>` on `payload` in tests/interop/mastra-om (its node_modules installed), Node in
    the zone `zone` (`TZ`)."""
    done = subprocess.run(
        ["node", "om.mjs", command],
        cwd=NODE_DIR,
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "TZ": zone},  # Mastra parses `Date:` headers and writes times in the local zone
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def record() -> dict[str, Any]:
    """Mastra's answers for the corpus: the token counts and the context texts."""
    return {
        "tokens": run_mastra("tokens", {"messages": MESSAGES, "observations": OBSERVATIONS}),
        "context": run_mastra("context", {"observations": OBSERVATIONS}),
        "built": run_mastra("build", {"cases": CONTEXT_CASES})["built"],
    }


if __name__ == "__main__" and sys.argv[1:] == ["record"]:
    RECORDING.parent.mkdir(parents=True, exist_ok=True)
    RECORDING.write_text(json.dumps(record(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
