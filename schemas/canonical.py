"""Is a stored `content` JSON string already what the models would write? (`canonical_content`)

The recall path splices stored `content` into the enriched event instead of validating it into a
`MessageContent` and dumping it again. That is only the same output when the stored text is exactly what
`MessageContent.model_validate_json(text).model_dump_json(exclude_unset=True)` gives. This module decides
that without building the models: it parses the text once (pydantic-core's own JSON parser, so numbers and
strings come out as the models see them), checks the structure against what the models accept and the key
order the models write (declared fields first, in declaration order, then unknown keys as they came), and
checks that writing the parsed value again gives the same bytes (no whitespace, no duplicate keys, escapes
and numbers as pydantic-core writes them). Anything it is not sure about answers None, and the caller takes
the model path, which decides as it always did (including refusing the row).

The tables below mirror `schemas.messages`; `tests/unit/test_recalled_rows.py` compares both on generated
content, so a model change that the tables miss fails there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final, get_args

from pydantic_core import from_json, to_json

from schemas.messages import _KNOWN_PARTS, ToolState

__all__ = ["canonical_content"]

Check = Callable[[Any], bool]


def _is_str(value: Any) -> bool:
    return type(value) is str


def _opt_str(value: Any) -> bool:
    return value is None or type(value) is str


def _any(value: Any) -> bool:
    return True


def _list_of_dicts(value: Any) -> bool:
    return type(value) is list and all(type(item) is dict for item in value)


def _opt_list_of_dicts(value: Any) -> bool:
    return value is None or _list_of_dicts(value)


def _opt_list(value: Any) -> bool:
    return value is None or type(value) is list


def _opt_dict(value: Any) -> bool:
    return value is None or type(value) is dict


def _is_format_2(value: Any) -> bool:
    return type(value) is int and value == 2


def _literal(*allowed: str) -> Check:
    options = frozenset(allowed)
    return lambda value: type(value) is str and value in options


# A model: its declared fields in declaration order, each (check, required); unknown keys are allowed.
Fields = tuple[tuple[str, Check, bool], ...]


_PLAN_CACHE_MAX: Final = 4096  # distinct key sequences remembered per model (rows repeat a few shapes)
# The cache holds its keys: bounded by their size too, and a wide dict's shape is never kept (issue 31: 60
# rows of 60,000-key metadata held 177 MB). Planning a shape is linear in its keys, so not caching one only
# costs what parsing it did.
_PLAN_CACHE_BYTES: Final = 1 << 20  # per model: the keys' characters plus a pointer each
_PLAN_CACHE_WIDTH: Final = 64  # keys; wider dicts are planned every time


def _shape_bytes(keys: tuple[str, ...]) -> int:
    """What caching `keys` costs, roughly: each key's characters and its slot in the tuple."""
    return sum(len(key) + 8 for key in keys)


def _model(fields: Fields) -> Check:
    names = {name: (i, check) for i, (name, check, _) in enumerate(fields)}
    required = [name for name, _, req in fields if req]
    plans: dict[tuple[str, ...], tuple[tuple[str, Check], ...] | None] = {}
    cached_bytes = 0

    def plan(keys: tuple[str, ...]) -> tuple[tuple[str, Check], ...] | None:
        """The checks for a dict with these keys in this order, or None when the order is not the models'."""
        last = -1
        in_extras = False
        checks: list[tuple[str, Check]] = []
        for key in keys:
            spec = names.get(key)
            if spec is None:
                in_extras = True  # unknown keys are written after every declared field
                continue
            position, check = spec
            if in_extras or position < last:
                return None
            last = position
            if check is not _any:
                checks.append((key, check))
        if not all(name in keys for name in required):
            return None
        return tuple(checks)

    def check(value: Any) -> bool:
        nonlocal cached_bytes
        if type(value) is not dict:
            return False
        keys = tuple(value)
        try:
            checks = plans[keys]
        except KeyError:
            checks = plan(keys)
            if len(plans) < _PLAN_CACHE_MAX and len(keys) <= _PLAN_CACHE_WIDTH:
                cost = _shape_bytes(keys)
                if cached_bytes + cost <= _PLAN_CACHE_BYTES:
                    plans[keys] = checks
                    cached_bytes += cost
        if checks is None:
            return False
        for key, field_check in checks:  # noqa: SIM110 -- a loop, no generator per dict (hot path)
            if not field_check(value[key]):
                return False
        return True

    return check


_TOOL_INVOCATION = _model(
    (
        (
            "state",
            _literal(*get_args(ToolState)),
            True,
        ),
        ("toolCallId", _is_str, True),
        ("toolName", _is_str, True),
        ("args", _any, False),
        ("result", _any, False),
    )
)
_SOURCE_INFO = _model((("sourceType", _is_str, True), ("id", _is_str, True), ("url", _opt_str, False)))
_ERROR_INFO = _model((("name", _opt_str, False), ("message", _is_str, True)))

_TYPE: Final = ("type", _is_str, True)
_PARTS: Final[Mapping[str, Check]] = {
    "text": _model((_TYPE, ("text", _is_str, True))),
    "reasoning": _model((_TYPE, ("reasoning", _is_str, False), ("details", _list_of_dicts, False))),
    "tool-invocation": _model((_TYPE, ("toolInvocation", _TOOL_INVOCATION, True))),
    "source": _model((_TYPE, ("source", _SOURCE_INFO, True))),
    "source-document": _model(
        (_TYPE, ("sourceId", _is_str, True), ("mediaType", _is_str, True), ("title", _is_str, True))
    ),
    "file": _model((_TYPE, ("mimeType", _is_str, True), ("data", _is_str, True))),
    "step-start": _model((_TYPE,)),
    "error": _model((_TYPE, ("error", _ERROR_INFO, True))),
}
assert set(_PARTS) == _KNOWN_PARTS
_DATA_PART = _model((_TYPE, ("data", _any, False)))
_UNKNOWN_PART = _model((_TYPE,))
# DataPart's `type` pattern; linear: anchored (`match`), one literal then one run of `.`
_DATA_TYPE = re.compile(r"^data-.+")  # DataPart's `type` pattern


def _part(value: Any) -> bool:
    kind = value.get("type") if type(value) is dict else None
    if type(kind) is not str:
        return False
    known = _PARTS.get(kind)
    if known is not None:
        return known(value)
    if kind.startswith("data-"):
        return _DATA_TYPE.match(kind) is not None and _DATA_PART(value)
    return _UNKNOWN_PART(value)


def _parts(value: Any) -> bool:
    return type(value) is list and all(_part(item) for item in value)


_CONTENT = _model(
    (
        ("format", _is_format_2, True),  # the models always write it, so a row without it is not canonical
        ("parts", _parts, True),
        ("content", _opt_str, False),
        ("toolInvocations", _opt_list_of_dicts, False),
        ("reasoning", _opt_str, False),
        ("annotations", _opt_list, False),
        ("experimental_attachments", _opt_list_of_dicts, False),
        ("metadata", _opt_dict, False),
        ("providerMetadata", _opt_dict, False),
    )
)


def canonical_content(text: str) -> bytes | None:
    """`text`'s UTF-8 bytes when they are exactly the models' dump of the content they hold, else None."""
    try:
        raw = text.encode()
        # NaN/Infinity: pydantic-core would parse them, but the models write them as null
        value = from_json(raw, allow_inf_nan=False)
    except ValueError:  # UnicodeEncodeError is one: a lone surrogate has no UTF-8 form
        return None
    if not _CONTENT(value):
        return None
    return raw if to_json(value) == raw else None
