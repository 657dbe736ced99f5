"""A private single-node KRaft broker a test owns: stopped, started again on its ports and data, or frozen.

Same jars and configuration as the local stack's (deploy/local/stack.py), its own ports and data directory,
so stopping or freezing it disturbs no other test. Shared by the outage and exactly-once fault tests.
"""

from __future__ import annotations

import gc
import importlib.util
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.infra import skip_or_fail
from tests.integration.ports import restartable_ports
from tests.integration.service_harness import ROOT


def _stack_module() -> ModuleType:
    """`deploy/local/stack.py` (stdlib only), for the broker's configuration, classpath and JVM options."""
    spec = importlib.util.spec_from_file_location("local_stack", ROOT / "deploy" / "local" / "stack.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CRASH_LEAKS = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
"""For a test that crashes the broker: aiokafka's unclosed-connection warnings, collected at its teardown."""


class PrivateKafka:
    """A private single-node KRaft broker that the test stops and starts again on the same ports and data."""

    def __init__(self, stack: ModuleType, home: Path) -> None:
        self.stack = stack
        self.home = home
        self.port, self.controller_port = restartable_ports(2)
        self.config = home / "server.properties"
        self.log = home / "kafka.log"
        self.java = stack.java_executable()
        self.process: subprocess.Popen[bytes] | None = None
        self.crashed = False  # SIGKILLed once: aiokafka may leave connections to it unclosed
        data = home / "data"
        data.mkdir(parents=True)
        stack.write_kafka_config(self.config, data, self.port, self.controller_port)
        subprocess.run(
            [self.java, "-Xmx256m", *self._common(), "kafka.tools.StorageTool", "format",
             "-t", stack.kafka_cluster_id(), "-c", str(self.config)],
            stdin=subprocess.DEVNULL, capture_output=True, check=True,
        )  # fmt: skip

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _common(self) -> list[str]:
        log4j = f"-Dlog4j2.configurationFile=file:{self.stack.KAFKA_LOG4J}"
        return [log4j, "-cp", f"{self.stack.KAFKA_LIBS}/*"]

    def start(self) -> None:
        started = self._ready_lines()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [self.java, *shlex.split("-Xms128m -Xmx384m"), *self.stack.KAFKA_JVM_OPTS, *self._common(),
                 f"-Dkafka.logs.dir={self.home}", "kafka.Kafka", str(self.config)],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.home,
            )  # fmt: skip
        deadline = time.monotonic() + 90
        while self._ready_lines() <= started:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Kafka did not start: {self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

    def _ready_lines(self) -> int:
        if not self.log.exists():
            return 0
        return self.log.read_text(errors="replace").count(self.stack.KAFKA_READY_LINE)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # controlled shutdown, as a rolling restart does
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def crash(self) -> None:
        """SIGKILL: the broker dies as a host does, with no controlled shutdown (its partitions keep it as
        their leader, and a restart recovers the logs and completes the transactions it had prepared)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self.process = None
        self.crashed = True

    def freeze(self) -> None:
        """SIGSTOP: the broker holds its connections open and answers nothing, as a stalled host does."""
        assert self.process is not None, "the broker is not running"
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None, "the broker is not running"
        self.process.send_signal(signal.SIGCONT)


@pytest.fixture
def private_kafka(tmp_path: Path) -> Iterator[PrivateKafka]:
    stack = _stack_module()
    if not Path(stack.KAFKA_LIBS).is_dir():
        reason = f"{stack.KAFKA_LIBS} is missing: run `deploy/local/stack install` first"
        skip_or_fail(reason)
    broker = PrivateKafka(stack, tmp_path / "kafka")
    broker.start()
    try:
        yield broker
    finally:
        if broker.process is not None and broker.process.poll() is None:
            broker.process.send_signal(signal.SIGCONT)  # a frozen broker cannot take SIGTERM
        broker.stop()
        if broker.crashed:
            # aiokafka (not the service) can leave a connection to a SIGKILLed broker unclosed: collected
            # here, within the test that crashed it (marked CRASH_LEAKS), not as an error in a later test
            gc.collect()
