"""`--profile`: where the service's own CPU goes, sampled with py-spy during a line's throughput window.

py-spy is not a project dependency (`pip install py-spy` in the virtualenv). It samples the process from
outside (100 Hz, active threads only) and writes collapsed stacks; `summarize` folds them into shares per
package of the innermost frame and the functions with the most self time.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench.progress import log

_PACKAGES = (
    "aiokafka",
    "kafka",
    "pymongo",
    "bson",
    "pydantic_core",
    "pydantic",
    "schemas",
    "message_history",
    "consumers",
    "producers",
    "storage",
    "prometheus_client",
    "asyncio",
    "json",
    "ssl",
    "selectors",
)


# functions whose inclusive share tells the stages apart (a sample counts once for each it is under)
_STAGES = (
    "getmany",
    "decode_request",
    "decode_response",
    "load",  # PrefetchedHistory.load / CollectingHistory.load: the MongoDB reads
    "list_messages_many",
    "message_from_doc",
    "recall",
    "persist_turn",
    "build_context",
    "from_request",
    "save_many",
    "encode",
    "publish",
    "_settle",
    "_commit",
)


class Sampler:
    """A py-spy recording of one process; `stop()` ends it and returns the summary (None without py-spy)."""

    def __init__(self, pid: int, output: Path) -> None:
        self.pid = pid
        self.output = output
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        beside = Path(sys.executable).parent / "py-spy"  # installed in the virtualenv, maybe not on PATH
        exe = str(beside) if beside.exists() else shutil.which("py-spy")
        if exe is None:
            log("--profile: py-spy is not installed (pip install py-spy); not profiling")
            return
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self._process = await asyncio.create_subprocess_exec(
            exe,
            "record",
            "--pid",
            str(self.pid),
            "--rate",
            "100",
            "--format",
            "raw",
            "--nonblocking",
            "--output",
            str(self.output),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )

    async def stop(self) -> dict[str, Any] | None:
        if self._process is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            await asyncio.wait_for(self._process.wait(), 30)
        except TimeoutError:
            self._process.kill()
            return None
        if not self.output.exists():
            return None
        return summarize(self.output.read_text().splitlines())


def _package(frame: str) -> str:
    """The package of a frame `function (path/to/file.py:line)`."""
    location = frame.rsplit("(", 1)[-1]
    parts = location.replace("\\", "/").split("/")
    for part in reversed(parts[:-1]):
        if part in _PACKAGES:
            return part
    filename = parts[-1].split(".py", 1)[0]
    return filename if filename in _PACKAGES else "other"


def summarize(rows: list[str], top: int = 15) -> dict[str, Any]:
    """Shares of samples: by the innermost frame's package, under each stage function (inclusive), and the
    functions with the most self samples. Pure."""
    by_package: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for row in rows:
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        n = int(count)
        total += n
        by_package[_package(leaf)] += n
        by_function[leaf] += n
        names = {frame.split(" (", 1)[0] for frame in stack.split(";")}
        for stage in _STAGES:
            if stage in names:
                inclusive[stage] += n
    if not total:
        return {"samples": 0}
    return {
        "samples": total,
        "share_by_package": {k: round(v / total, 3) for k, v in by_package.most_common()},
        "inclusive_share": {k: round(v / total, 3) for k, v in inclusive.most_common()},
        "top_self": [{"frame": k, "share": round(v / total, 3)} for k, v in by_function.most_common(top)],
    }
