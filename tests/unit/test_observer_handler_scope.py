"""The Python SDK's `observer_handler` with resource scope: the user's `observe` is called once per thread
(the thread's messages, the whole log), and the answer names each thread with its own cursor."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.observational import ObserveRequest, ObserveResult, ReflectRequest, ReflectResult
from worker.observer import Observation, observer_handler


def _work(scope: str = "resource") -> ObserveRequest:
    def msg(i: int, thread: str) -> dict[str, Any]:
        return {
            "id": f"m{i}",
            "role": "user",
            "threadId": thread,
            "resourceId": "u1",
            "createdAt": f"2025-03-01T10:0{i}:00.000Z",
            "content": {"format": 2, "parts": [{"type": "text", "text": f"hi {i}"}]},
        }

    return ObserveRequest.model_validate(
        {
            "schemaVersion": 1,
            "type": "ObserveRequest",
            "requestId": "r1",
            "createdAt": "2025-03-01T11:00:00.000Z",
            "scope": scope,
            "threadId": None if scope == "resource" else "a",
            "resourceId": "u1",
            "recordId": "row",
            "generation": 0,
            "cycle": 1,
            "messages": [msg(1, "a"), msg(2, "b"), msg(3, "a")],
            "activeObservations": "log",
            "observationTokenCount": 1,
            "pendingTokens": 10,
            "messageTokens": 5,
        }
    )


async def test_resource_work_is_observed_thread_by_thread() -> None:
    seen: list[tuple[list[str], str]] = []

    async def observe(work: ObserveRequest) -> Observation:
        seen.append(([m.id or "" for m in work.messages], work.activeObservations))
        thread = work.messages[0].threadId
        extracted = {"mood": f"mood {thread}"}
        return Observation(
            f"obs {thread}", current_task="task", thread_title=f"title {thread}", extracted=extracted
        )

    result = await observer_handler(observe)(_work())
    assert isinstance(result, ObserveResult)
    assert seen == [(["m1", "m3"], "log"), (["m2"], "log")]
    assert result.threads is not None
    assert [(t.threadId, t.observations, t.currentTask, t.threadTitle) for t in result.threads] == [
        ("a", "obs a", "task", "title a"),
        ("b", "obs b", "task", "title b"),
    ]
    assert [t.extracted for t in result.threads] == [{"mood": "mood a"}, {"mood": "mood b"}]
    assert [t.lastObservedAt.minute for t in result.threads] == [3, 2]  # each thread's own newest
    assert result.observedMessageIds == ["m1", "m2", "m3"]
    assert result.error is None


async def test_a_failing_observer_answers_error_without_threads() -> None:
    async def observe(work: ObserveRequest) -> str:
        raise RuntimeError("model down")

    result = await observer_handler(observe)(_work())
    assert isinstance(result, ObserveResult)
    assert result.error == "RuntimeError: model down"
    assert result.threads is None


async def test_thread_work_keeps_one_call_and_no_threads() -> None:
    async def observe(work: ObserveRequest) -> str:
        return f"{len(work.messages)} messages"

    result = await observer_handler(observe)(_work("thread"))
    assert isinstance(result, ObserveResult)
    assert result.observations == "3 messages"
    assert result.threads is None


async def test_thread_work_carries_the_observers_title() -> None:
    async def observe(work: ObserveRequest) -> Observation:
        return Observation("obs", current_task="task", thread_title="Trip to Lyon", extracted={"n": [1]})

    result = await observer_handler(observe)(_work("thread"))
    assert isinstance(result, ObserveResult)
    assert result.extracted == {"n": [1]}
    assert (result.currentTask, result.threadTitle, result.suggestedResponse) == (
        "task",
        "Trip to Lyon",
        None,
    )


_RESOURCE_LOG = (
    '<thread id="a">\nDate: Mar 1, 2025\n* tea\n</thread>\n\n'
    '<thread id="b">\nDate: Mar 1, 2025\n* tea\n</thread>'
)


def _reflect_work() -> ReflectRequest:
    return ReflectRequest.model_validate(
        {
            "schemaVersion": 1,
            "type": "ReflectRequest",
            "requestId": "r1",
            "createdAt": "2025-03-01T11:00:00.000Z",
            "scope": "resource",
            "threadId": None,
            "resourceId": "u1",
            "recordId": "row",
            "generation": 2,
            "cycle": 4,
            "activeObservations": _RESOURCE_LOG,
            "observationTokenCount": 40,
            "observationTokens": 30,
        }
    )


async def test_resource_work_is_reflected_in_one_call_on_the_whole_log() -> None:
    """Reflection with resource scope is one `reflect` call on the resource's whole log, its `<thread>`
    sections as text (what Mastra's Reflector is given), answered for the resource's row: the claim echoed,
    no thread, the Reflector's text as it wrote it (the service stores it as the next generation)."""
    seen: list[ReflectRequest] = []

    async def reflect(work: ReflectRequest) -> str:
        seen.append(work)
        return 'Date: Mar 1, 2025\n* tea (both threads)\n<thread id="b">\n* more\n</thread>'

    async def observe(work: ObserveRequest) -> str:
        raise AssertionError("a reflection calls no observe")

    result = await observer_handler(observe, reflect)(_reflect_work())
    assert isinstance(result, ReflectResult)
    assert [w.activeObservations for w in seen] == [_RESOURCE_LOG]
    assert (result.scope, result.threadId, result.resourceId) == ("resource", None, "u1")
    assert (result.recordId, result.generation, result.cycle) == ("row", 2, 4)
    assert result.reflection == 'Date: Mar 1, 2025\n* tea (both threads)\n<thread id="b">\n* more\n</thread>'
    assert result.error is None


@pytest.mark.parametrize("scope", ["thread", "resource"])
async def test_an_answer_past_its_bounds_is_an_error_answer(scope: str) -> None:
    """An `extracted` the service would refuse (here: a key with a dot) answers `error` (the claim released),
    instead of raising out of the worker's loop."""

    async def observe(work: ObserveRequest) -> Observation:
        return Observation("obs", extracted={"a.b": 1})

    result = await observer_handler(observe)(_work(scope))
    assert isinstance(result, ObserveResult)
    assert result.error is not None
    assert "extracted" in result.error
    assert (result.threads, result.extracted) == (None, None)
