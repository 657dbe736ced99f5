"""The per-request context of a turn, and the `MastraMemory` entry MessageHistory reads from it.

As in Mastra, the thread id, resource id and memory config of a turn travel in a small key/value context
(`RequestContext`) under the key `"MastraMemory"`:

    {"thread": {"id": "t1", ...}, "resourceId": "r1", "memoryConfig": {"readOnly": False, "lastMessages": 20}}

`parse_memory_context` validates that entry the way Mastra's `parseMemoryRequestContext` does (the value must
be an object, `thread.id` a string, `resourceId` a string) and, because Python callers get no compiler
checks, also the two `memoryConfig` keys this package reads. Violations raise `EventValidationError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from message_history.core.rules import LastMessages
from message_history.errors import EventValidationError

__all__ = [
    "MASTRA_MEMORY",
    "USE_DEFAULT",
    "MemoryContext",
    "RequestContext",
    "UseDefault",
    "parse_memory_context",
]

MASTRA_MEMORY: Final = "MastraMemory"
"""The request-context key holding the turn's memory context (Mastra's name)."""


class RequestContext:
    """A mutable string-keyed map with Mastra's `RequestContext` methods (`get`, `set`, `has`, `delete`)."""

    def __init__(self, entries: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None) -> None:
        self._entries: dict[str, Any] = dict(entries or {})

    def get(self, key: str, default: Any = None) -> Any:
        return self._entries.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self._entries[key] = value

    def has(self, key: str) -> bool:
        return key in self._entries

    def delete(self, key: str) -> bool:
        """Remove `key`; True when it was there."""
        return self._entries.pop(key, _MISSING) is not _MISSING

    def clear(self) -> None:
        self._entries.clear()

    def keys(self) -> list[str]:
        return list(self._entries)

    def items(self) -> list[tuple[str, Any]]:
        return list(self._entries.items())

    @property
    def size(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"RequestContext({self._entries!r})"


_MISSING: Final = object()


class UseDefault:
    """Sentinel type: "take the processor's own `last_messages`"."""

    _instance: UseDefault | None = None

    def __new__(cls) -> UseDefault:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "USE_DEFAULT"


USE_DEFAULT: Final = UseDefault()
"""Pass as `last_messages` to `MessageHistory.recall` to use the processor's configured value; a turn's
`MemoryContext.last_messages` when its `memoryConfig` has no `lastMessages`."""


@dataclass(frozen=True, slots=True)
class MemoryContext:
    """The validated `MastraMemory` entry.

    `last_messages` is a per-turn `memoryConfig.lastMessages` (which overrides the processor's own, `None`
    meaning the default 40), or `USE_DEFAULT` when the turn has none.
    """

    thread_id: str | None
    resource_id: str | None
    read_only: bool = False
    last_messages: LastMessages | UseDefault = USE_DEFAULT
    thread: Mapping[str, Any] | None = None


def _field(value: object, name: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)


def parse_memory_context(request_context: RequestContext | Mapping[str, Any] | None) -> MemoryContext | None:
    """The turn's memory context, or None when there is no context or no (truthy) `MastraMemory` entry."""
    if request_context is None:
        return None
    raw = request_context.get(MASTRA_MEMORY)
    if not raw:
        return None
    if not isinstance(raw, Mapping):
        raise EventValidationError(f"expected an object, got {type(raw).__name__}", MASTRA_MEMORY)

    thread_id: str | None = None
    thread = raw.get("thread")
    thread_map: Mapping[str, Any] | None = None
    if thread is not None:
        # A full thread row (a mapping) or a storage Thread object, as Mastra puts the loaded row here.
        if isinstance(thread, str | int | float | bool | list | tuple):
            raise EventValidationError(
                f"expected an object, got {type(thread).__name__}", f"{MASTRA_MEMORY}.thread"
            )
        thread_id = _field(thread, "id")
        if not isinstance(thread_id, str):
            raise EventValidationError(
                f"expected a string, got {type(thread_id).__name__}", f"{MASTRA_MEMORY}.thread.id"
            )
        thread_map = thread if isinstance(thread, Mapping) else None

    resource_id = raw.get("resourceId")
    if resource_id is not None and not isinstance(resource_id, str):
        raise EventValidationError(
            f"expected a string, got {type(resource_id).__name__}", f"{MASTRA_MEMORY}.resourceId"
        )

    config = raw.get("memoryConfig")
    read_only = False
    last_messages: LastMessages | UseDefault = USE_DEFAULT
    if config is not None:
        if not isinstance(config, Mapping):
            raise EventValidationError(
                f"expected an object, got {type(config).__name__}", f"{MASTRA_MEMORY}.memoryConfig"
            )
        flag = config.get("readOnly")
        if flag is not None and not isinstance(flag, bool):
            raise EventValidationError(
                f"expected a boolean, got {type(flag).__name__}", f"{MASTRA_MEMORY}.memoryConfig.readOnly"
            )
        read_only = bool(flag)
        if "lastMessages" in config:
            value = config["lastMessages"]
            valid = (
                value is None
                or value is False
                or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
            )
            if not valid:
                raise EventValidationError(
                    f"expected a non-negative integer, false or null, got {value!r}",
                    f"{MASTRA_MEMORY}.memoryConfig.lastMessages",
                )
            last_messages = value

    return MemoryContext(
        thread_id=thread_id,
        resource_id=resource_id,
        read_only=read_only,
        last_messages=last_messages,
        thread=thread_map,
    )
