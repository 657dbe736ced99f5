"""An observer worker process for the fault tests (`test_observer_worker_faults.py`): `ObserverWorker` +
`observer_handler` on the service's topics, its settings from the environment (`settings_env`).

    python -m tests.integration.observer_worker_proc MODE GROUP MARKER TEXT

* `hang-in-observe`: the observe function writes MARKER, then never returns (killed inside the handler:
  nothing answered, nothing committed).
* `hang-at-commit`: answers TEXT; once the answer is acknowledged, the offset commit writes MARKER and never
  returns (killed between its answer and its commit: the work will be answered again).
* `answer`: answers TEXT at once; on SIGTERM stops, prints `answered <n>` and exits 0.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from message_history.settings import Settings
from schemas.observational import ObserveRequest
from worker.observer import ObserverWorker, observer_handler


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()


async def main(mode: str, group: str, marker: Path, text: str) -> int:
    async def observe(work: ObserveRequest) -> str:
        if mode == "hang-in-observe":
            marker.write_text(f"{work.requestId} {work.cycle}")
            await _forever()
        return text

    if mode == "hang-at-commit":

        async def commit(self: AIOKafkaConsumer, offsets: Any = None) -> None:
            marker.write_text(f"commit {offsets}")
            await _forever()

        AIOKafkaConsumer.commit = commit

    worker = ObserverWorker.from_settings(observer_handler(observe), Settings(), group_id=group)
    async with worker:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
        answered = await worker.run()
    print(f"answered {answered}", flush=True)
    return 0


if __name__ == "__main__":
    mode, group, marker, text = sys.argv[1:5]
    sys.exit(asyncio.run(main(mode, group, Path(marker), text)))
