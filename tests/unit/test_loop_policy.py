"""The loop's retry policy: which errors are outages, and how long to back off."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
)

from consumers.runtime.retry import backoff_delay, is_outage
from message_history.errors import (
    EventValidationError,
    FatalStorageError,
    StorageUnavailableError,
    ThreadOwnershipError,
)


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        pytest.param(StorageUnavailableError("down"), True, id="mongodb-unavailable"),
        pytest.param(KafkaConnectionError(), True, id="kafka-connection"),
        pytest.param(KafkaTimeoutError(), True, id="kafka-timeout"),
        pytest.param(RequestTimedOutError(), True, id="request-timed-out"),
        pytest.param(NotLeaderForPartitionError(), True, id="not-leader"),
        pytest.param(ConnectionResetError(), True, id="socket-reset"),
        pytest.param(EventValidationError("bad"), False, id="bad-input"),
        pytest.param(ThreadOwnershipError("t", "a", "b"), False, id="ownership"),
        pytest.param(FatalStorageError("auth"), False, id="fatal-storage"),
        pytest.param(MessageSizeTooLargeError(), False, id="too-large"),
        pytest.param(TopicAuthorizationFailedError(), False, id="not-authorized"),
        pytest.param(RuntimeError("bug"), False, id="bug"),
    ],
)
def test_is_outage(error: BaseException, outage: bool) -> None:
    """Unreachable or slow dependencies are outages (retry); bad input, refusals and bugs are not."""
    assert is_outage(error) is outage


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        pytest.param(1, 0.0, 0.1, id="first-min"),
        pytest.param(1, 1.0, 0.2, id="first-max"),
        pytest.param(3, 0.0, 0.4, id="doubles"),
        pytest.param(3, 0.5, 0.6, id="jitter-in-between"),
        pytest.param(20, 0.0, 5.0, id="capped-min"),
        pytest.param(20, 1.0, 10.0, id="capped-max"),
    ],
)
def test_backoff_delay(attempt: int, rand: float, expected: float) -> None:
    """Exponential from the initial delay, capped, with half of it random."""
    delay = backoff_delay(attempt, initial=0.2, maximum=10.0, rand=lambda: rand)
    assert delay == pytest.approx(expected)
