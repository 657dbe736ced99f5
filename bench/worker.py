"""`python -m bench.worker KIND CONFIG_JSON`: one measured line in its own process (clean CPU and RSS).

KIND is `passthrough` (B1) or `naive`: they run until SIGTERM, measured from outside through Kafka; or
`mongo` (B2/B3): it runs to the end and prints its result as one JSON line on stdout.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any


async def _until_signal(kind: str, config: dict[str, Any]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if kind == "passthrough":
        from bench import passthrough  # noqa: PLC0415 -- import only what this worker runs

        await passthrough.run(config, stop)
    else:
        from bench import naive  # noqa: PLC0415

        await naive.run(config, stop)


def main(argv: list[str]) -> int:
    kind, config = argv[0], json.loads(argv[1])
    if kind == "mongo":
        from bench import mongo_lines  # noqa: PLC0415

        print(json.dumps(asyncio.run(mongo_lines.run(config))), flush=True)
    elif kind in ("passthrough", "naive"):
        asyncio.run(_until_signal(kind, config))
    else:
        print(f"unknown worker kind {kind!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
