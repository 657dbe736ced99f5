"""What every line of one run shares: endpoints, the workload, the seeded database, budgets, names."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bench.procstat import Servers
from bench.progress import log
from bench.workload import Turns, Workload
from message_history.settings import Settings

REPO = Path(__file__).resolve().parent.parent
MONGODB_TIMEOUT_MS = 600_000

SERVICE_RUNTIME_ENV: Mapping[str, str] = {}
"""The runtime environment the image gives the service beyond its settings (deploy/Dockerfile's ENV, the
chart's env, the local stack's launch): every service process of the bench gets it, so the bench measures
what production runs (`--service-env` replaces it for an A/B). Empty: the glibc malloc tunables measured for
issue 25 did not pay (docs/operations.md#11-runtime-and-allocator-settings); the GC settings are the
service's own defaults."""


def parse_env(text: str) -> dict[str, str]:
    """`--service-env`: `K=V,K=V`; `image` is `SERVICE_RUNTIME_ENV`, `none` (or nothing) is empty. Pure."""
    if text.strip() == "image":
        return dict(SERVICE_RUNTIME_ENV)
    pairs = [item.strip() for item in text.split(",") if item.strip() and item.strip() != "none"]
    bad = [item for item in pairs if "=" not in item]
    if bad:
        raise ValueError(f"not K=V: {', '.join(bad)}")
    return dict(item.split("=", 1) for item in pairs)


MIN_LATENCY_RATE: Final = 0.2
"""The slowest latency phase, events per second (slower, a line's few timed events would take minutes)."""


@dataclass
class Budget:
    """How long lines may take: a line stops after `line_seconds` of measuring and reports what it did."""

    line_seconds: float = 300.0
    latency_events: int = 1000
    latency_seconds: float = 20.0
    load_fraction: float = 0.5  # latency is measured at this share of the line's measured throughput
    latency_rate: float | None = None  # or at this rate (events/s) for every line: tails at equal load
    startup_timeout_s: float = 120.0
    mastra_concurrency: int = 32
    idle_turns: int = 300  # timed turns of the idle-latency line (`bench.idle`)


@dataclass
class RunContext:
    settings: Settings
    workload: Workload
    db: str
    servers: Servers
    budget: Budget
    log_dir: Path
    turns: Turns
    topics: list[str] = field(default_factory=list)  # created by the run, deleted at its end
    profile: bool = False  # py-spy the service during its throughput windows
    watch: bool = False  # the service lines under `bench.stepwatch`: their latency tail split (`--watch`)
    settle: Callable[[], Awaitable[float]] | None = None  # waits until the servers are quiet again
    restore: Callable[[], Awaitable[int]] | None = None  # removes every message written after seeding
    service_env: Mapping[str, str] = field(default_factory=lambda: dict(SERVICE_RUNTIME_ENV))

    async def quiet(self, *, wrote: bool = False) -> None:
        """Between lines: wait until the servers have finished what the last line left in flight; after a
        line that wrote, put the database back as seeded, so that every line meets the same collection
        (on a server that scans, a larger collection alone would make later lines slower)."""
        if self.settle is not None:
            waited = await self.settle()
            if waited > 5:
                log(f"waited {waited:.0f} s for the servers to finish the previous line's work")
        if wrote and self.restore is not None:
            await self.restore()

    def topic(self, *parts: str) -> str:
        name = "-".join(("bench", self.workload.run_id, *parts))
        self.topics.append(name)
        return name

    def child_env(self, **extra: str) -> dict[str, str]:
        """The harness's environment for a child: the repository importable, the settings' endpoints."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        env["KAFKA_BOOTSTRAP_SERVERS"] = self.settings.kafka_bootstrap_servers
        env["MONGODB_URI"] = self.settings.mongodb_uri.get_secret_value()
        env["MONGODB_DATABASE"] = self.db
        env["MESSAGE_HISTORY_LAST_MESSAGES"] = str(self.workload.history)
        env["MESSAGE_HISTORY_MAX_BATCH_RECORDS"] = str(self.workload.batch)
        env["MESSAGE_HISTORY_LOG_LEVEL"] = "WARNING"
        # a whole batch's bulk write is one MongoDB operation: on a slow server it may take longer than the
        # 5 s default, which the service (rightly) treats as an outage; the benchmark measures capacity
        env["MESSAGE_HISTORY_MONGODB_TIMEOUT_MS"] = str(MONGODB_TIMEOUT_MS)
        env.update(extra)
        return env

    def service_child_env(self, **extra: str) -> dict[str, str]:
        """`child_env` for a `message-history run` process: the service's runtime environment too."""
        return self.child_env(**self.service_env, **extra)

    @staticmethod
    def python() -> str:
        return sys.executable
