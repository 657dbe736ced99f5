"""Child processes of the harness: the measured lines run apart, so their CPU and memory are their own.

Two shapes: a long-running line (the service, B1, naive) whose output goes to a log file and which is stopped
with SIGTERM; and a line that runs to its end (B2/B3, Node) and prints its result as one JSON object on
stdout, framing its measured part with `@@bench start` / `@@bench end` on stderr so that the harness can read
the servers' CPU exactly around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.procstat import Servers

START, END = "@@bench start", "@@bench end"


async def spawn(
    argv: Sequence[str], *, env: Mapping[str, str], log: Path, cwd: Path | None = None
) -> asyncio.subprocess.Process:
    """Start a long-running line; its stdout and stderr go to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:
        return await asyncio.create_subprocess_exec(
            *argv, env=dict(env), stdout=sink, stderr=sink, cwd=cwd, stdin=asyncio.subprocess.DEVNULL
        )


async def stop(process: asyncio.subprocess.Process, *, grace_s: float = 40.0) -> int | None:
    """SIGTERM, then SIGKILL after `grace_s`; the exit code."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return process.returncode


async def run_to_end(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log: Path,
    servers: Servers,
    timeout_s: float,
    cwd: Path | None = None,
) -> tuple[dict[str, Any], dict[str, float]]:
    """Run a line to its end; (its JSON result, the servers' CPU seconds between its markers)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=dict(env),
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    marks: dict[str, dict[str, float]] = {}

    async def read_stderr(stream: asyncio.StreamReader) -> None:
        with log.open("a") as sink:
            async for raw in stream:
                line = raw.decode(errors="replace").rstrip()
                if line in (START, END):
                    marks[line] = servers.cpu()
                    continue
                sink.write(line + "\n")
                if line.startswith("[") and "]" in line[:12]:  # a progress line of the child
                    print(line, file=sys.stderr, flush=True)

    assert process.stdout is not None
    assert process.stderr is not None
    errors = asyncio.create_task(read_stderr(process.stderr))
    try:
        out = await asyncio.wait_for(process.stdout.read(), timeout_s)
        await asyncio.wait_for(process.wait(), 30)
        await errors
    finally:
        if process.returncode is None:
            await stop(process, grace_s=5)
        errors.cancel()
    if process.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited with {process.returncode}; see {log}")
    lines = [line for line in out.decode().splitlines() if line.strip().startswith("{")]
    if not lines:
        raise RuntimeError(f"{argv[0]} printed no result; see {log}")
    start, end = marks.get(START, {}), marks.get(END, {})
    server_cpu = {k: end[k] - start[k] for k in start.keys() & end.keys()}
    result: dict[str, Any] = json.loads(lines[-1])
    return result, server_cpu
