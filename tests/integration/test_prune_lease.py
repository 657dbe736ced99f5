"""The prune lease on the real MongoDB-wire server: one holder at a time, taken over after expiry; two
periodic prune loops (two replicas) prune once per interval between them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from pymongo import AsyncMongoClient

from message_history.app.periodic_prune import PRUNE_LEASE, periodic_prune, prune_round
from message_history.settings import Settings
from storage.lease import MongoLease
from storage.pruning import MongoPruner, PruneProgress
from tests import infra
from tests.integration.service_harness import fresh_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TTL = timedelta(seconds=30)
WAIT_S = 60.0


@pytest_asyncio.fixture
async def clients(mongo_uri: str) -> AsyncIterator[tuple[AsyncMongoClient[dict[str, Any]], ...]]:
    """Two clients, one per replica."""
    pair = tuple(AsyncMongoClient[dict[str, Any]](mongo_uri, tz_aware=True) for _ in range(2))
    try:
        yield pair
    finally:
        for client in pair:
            await client.close()


@pytest.fixture
def db_name() -> str:
    return infra.unique_name("lease_").replace("-", "_")


async def test_one_holder_at_a_time_and_a_takeover_after_expiry(
    clients: tuple[AsyncMongoClient[dict[str, Any]], ...], db_name: str
) -> None:
    """Eight replicas (on two connections) race for a fresh lease: one wins; the holder renews it, the others
    are refused until it expires; then one of them takes it and the old holder is refused."""
    try:
        now = datetime.now(UTC)
        leases = [MongoLease(clients[i % 2][db_name], "prune", holder=f"r{i}", ttl=TTL) for i in range(8)]
        won = await asyncio.gather(*(lease.acquire(now=now) for lease in leases))
        assert won.count(True) == 1, won
        holder = leases[won.index(True)]
        other = leases[(won.index(True) + 1) % 8]

        half = now + TTL / 2
        assert await holder.acquire(now=half)  # renewed: now held until half + TTL
        assert not await other.acquire(now=half)
        assert not await other.acquire(now=now + TTL + timedelta(seconds=1))  # the renewal counts
        current = await other.current()
        assert current is not None
        assert current.holder == holder.holder

        after = half + TTL
        assert await other.acquire(now=after)  # expired: taken over
        assert not await holder.acquire(now=after)
    finally:
        await clients[0].drop_database(db_name)


class _Rounds(logging.Handler):
    """The periodic prune's log lines: (replica, pruned) per round, `pruned` False for a skip, and the
    holder a skip line names."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.rounds: list[tuple[str, bool]] = []
        self.taken_by: list[str | None] = []

    def emit(self, record: logging.LogRecord) -> None:
        pruned = getattr(record, "pruned", None)
        if pruned is None:
            return
        self.rounds.append((str(getattr(record, "replica", "?")), bool(pruned)))
        self.taken_by.append(getattr(record, "lease_holder", None))

    def count(self, replica: str, *, pruned: bool) -> int:
        return sum(1 for r, p in self.rounds if r == replica and p is pruned)


@contextlib.contextmanager
def _captured() -> Any:
    logger = logging.getLogger("message_history.app.periodic_prune")
    handler, level = _Rounds(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` (log lines arrive from other tasks) for at most `WAIT_S` seconds."""
    for _ in range(int(WAIT_S / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} (not within {WAIT_S:.0f}s)")


def _settings(kafka_bootstrap: str, mongo_uri: str, db_name: str) -> Settings:
    return fresh_settings(
        # 3 s rounds: the lease (two rounds) outlives a holder's stall of a few seconds on a busy machine
        kafka_bootstrap,
        mongo_uri,
        MONGODB_DATABASE=db_name,
        prune_older_than="1d",
        prune_interval_s=3.0,
    )


async def _replica(
    settings: Settings, client: AsyncMongoClient[dict[str, Any]], name: str, stop: asyncio.Event
) -> None:
    """One replica's periodic prune (its lease holder is `name`) until `stop`."""
    async with periodic_prune(client[settings.mongodb_database], settings, holder=name):
        await stop.wait()


async def test_two_replicas_prune_once_per_interval_and_the_survivor_takes_over(
    kafka_bootstrap: str,
    mongo_uri: str,
    clients: tuple[AsyncMongoClient[dict[str, Any]], ...],
    db_name: str,
) -> None:
    """Two periodic prune loops on one database: rounds by one replica only prune, the other's rounds skip
    (at debug level, naming the holder); once the holder stops, the other prunes after the lease expires."""
    settings = _settings(kafka_bootstrap, mongo_uri, db_name)
    stops = {"a": asyncio.Event(), "b": asyncio.Event()}
    with _captured() as log:
        tasks = {
            name: asyncio.create_task(_replica(settings, clients[i], name, stops[name]), name=name)
            for i, name in enumerate(stops)
        }
        try:
            await _until(lambda: any(p for _, p in log.rounds), "no replica pruned")
            holder = next(r for r, pruned in log.rounds if pruned)
            other = "b" if holder == "a" else "a"
            await _until(
                lambda: log.count(holder, pruned=True) >= 3 and log.count(other, pruned=False) >= 2,
                f"expected 3 prunes by {holder} and 2 skips by {other}: {log.rounds}",
            )
            assert log.count(other, pruned=True) == 0, log.rounds  # never both in one interval
            skips = [t for (r, p), t in zip(log.rounds, log.taken_by, strict=True) if r == other and not p]
            assert set(skips) == {holder}  # the skip line names the holder

            stops[holder].set()
            await tasks[holder]
            stopped_at = len(log.rounds)
            await _until(lambda: log.count(other, pruned=True) >= 1, f"{other} never took over: {log.rounds}")
            assert all(r == other for r, _ in log.rounds[stopped_at:])
        finally:
            for stop in stops.values():
                stop.set()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            await clients[0].drop_database(db_name)


async def test_without_the_lease_both_replicas_prune(
    kafka_bootstrap: str,
    mongo_uri: str,
    clients: tuple[AsyncMongoClient[dict[str, Any]], ...],
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check above can fail: with a lease that always lets its caller in, both replicas prune."""

    async def always(self: MongoLease, *, now: datetime | None = None) -> bool:
        return True

    monkeypatch.setattr(MongoLease, "acquire", always)
    settings = _settings(kafka_bootstrap, mongo_uri, db_name)
    stops = {"a": asyncio.Event(), "b": asyncio.Event()}
    with _captured() as log:
        tasks = [
            asyncio.create_task(_replica(settings, clients[i], name, stops[name]), name=name)
            for i, name in enumerate(stops)
        ]
        try:
            await _until(
                lambda: log.count("a", pruned=True) >= 1 and log.count("b", pruned=True) >= 1,
                f"expected both replicas to prune: {log.rounds}",
            )
        finally:
            for stop in stops.values():
                stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await clients[0].drop_database(db_name)


class _SlowPruner(MongoPruner):
    """A prune that lasts until `release` is set (a prune longer than the lease)."""

    def __init__(self, db: Any) -> None:
        super().__init__(db)
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def prune(self, cutoff: datetime, **_: Any) -> PruneProgress:
        self.started.set()
        await self.release.wait()
        return PruneProgress(done=True)


async def test_a_prune_longer_than_the_lease_keeps_it(
    clients: tuple[AsyncMongoClient[dict[str, Any]], ...], db_name: str
) -> None:
    """The holder renews the lease while it prunes: past the first expiry another replica is still refused."""
    ttl = timedelta(seconds=6)  # renewed every 1.5 s: a stall of seconds does not lose it
    db_a, db_b = clients[0][db_name], clients[1][db_name]
    lease_a = MongoLease(db_a, PRUNE_LEASE, holder="a", ttl=ttl)
    lease_b = MongoLease(db_b, PRUNE_LEASE, holder="b", ttl=ttl)
    pruner = _SlowPruner(db_a)
    try:
        running = asyncio.create_task(prune_round(pruner, lease_a, timedelta(days=1)))
        await asyncio.wait_for(pruner.started.wait(), WAIT_S)
        taken_at = datetime.now(UTC)  # the lease was taken before the prune started: it expires earlier
        first_expiry = taken_at + ttl
        await _until(lambda: datetime.now(UTC) > first_expiry + ttl / 4, "the first expiry never passed")
        assert not await lease_b.acquire()  # renewed meanwhile
        pruner.release.set()
        assert await asyncio.wait_for(running, WAIT_S) is True
        assert not await lease_b.acquire()  # renewed once more at the end
    finally:
        pruner.release.set()
        await clients[0].drop_database(db_name)
