"""Issue 31's first example through the real stack (Kafka, a MongoDB-wire server, the service in process): a
client whose message id is `password="` and backslashes, sent on two of its own threads. The second turn is a
`MessageIdTakenError`, and building its dead letter scrubs that id: with the old scrubber pattern this
backtracked exponentially and held the event loop (16 backslashes: minutes; 24: ages), here it is a dead
letter at once, the id masked, and the next turns are served; `/livez` answers every probe throughout
(tests/integration/livez_prober.py). The pure guards: test_regex_bounds.py.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import AsyncIterator

import pytest

from message_history.app.health import Health
from message_history.logs import MASK
from tests.conftest import MakeTopic
from tests.integration import livez_prober
from tests.integration.livez_prober import Probes, assert_all_answered, free_port, probing
from tests.integration.service_harness import drop_database, fresh_settings, running_service, text_message
from tests.integration.test_tenancy import Stack, _response

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HOSTILE_ID = 'password="' + "\\" * 24


@pytest.fixture
async def stack_and_health(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> AsyncIterator[tuple[Stack, Health, Probes]]:
    port = free_port()
    settings = fresh_settings(kafka_bootstrap, mongo_uri, http_port=port)
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)
    health = Health()
    try:
        async with running_service(settings, health=health):
            with probing(port, "the hostile id test") as probes:
                yield Stack(settings), health, probes
    finally:
        await drop_database(settings)


async def test_a_backslash_message_id_is_a_dead_letter_at_once(
    stack_and_health: tuple[Stack, Health, Probes],
) -> None:
    """The same hostile id on two threads of one client: the first turn is saved, the second is a dead letter
    whose reason masks the id; the service stays live (every `/livez` probe answered, 200) and serves the
    next turn."""
    stack, health, probes = stack_and_health
    first = _response(
        "thread-1",
        "client",
        "t1",
        [text_message("user", "hi", id=HOSTILE_ID)],
        [text_message("assistant", "ok")],
    )
    assert await stack.answer(first)
    second = _response(
        "thread-2",
        "client",
        "t2",
        [text_message("user", "hi", id=HOSTILE_ID)],
        [text_message("assistant", "ok")],
    )
    assert await stack.answer(second) is None
    [(error_type, _, reason)] = await stack.letters()
    assert error_type == "MessageIdTakenError"
    assert f'password="{MASK}' in reason
    assert "\\\\\\\\" not in reason
    assert health.liveness()[0]
    assert await stack.turn("thread-3", "client", "t3", "still served")
    assert_all_answered(probes)


def test_the_prober_fails_when_the_probe_goes_unanswered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard can fail: a server that answers, then holds its replies (as a held event loop would), is
    seen as probes not answered within the socket timeout, and `assert_all_answered` refuses."""
    monkeypatch.setattr(livez_prober, "PROBE_TIMEOUT_S", 0.3)
    held = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if held.is_set():
                time.sleep(1.0)  # past the probe's timeout
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with livez_prober.probing(server.server_address[1], "a server that stops answering") as probes:
            time.sleep(0.5)
            held.set()
            time.sleep(1.0)
    finally:
        server.shutdown()
        server.server_close()
    assert 200 in probes.statuses
    assert None in probes.statuses
    with pytest.raises(AssertionError):
        livez_prober.assert_all_answered(probes)
