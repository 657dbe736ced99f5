"""The run's record: the machine it ran on, every line, the ratios; written as JSON and printed as a table."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench import targets
from bench.stats import LineResult, ratios, render_table


def machine() -> dict[str, Any]:
    """nproc, memory, CPU model, and the runtimes' versions."""
    info: dict[str, Any] = {"nproc": os.cpu_count(), "python": platform.python_version()}
    try:
        for row in Path("/proc/meminfo").read_text().splitlines():
            if row.startswith("MemTotal:"):
                info["memory_gib"] = round(int(row.split()[1]) / 2**20, 1)
        models = [
            row.split(":", 1)[1].strip()
            for row in Path("/proc/cpuinfo").read_text().splitlines()
            if row.startswith("model name")
        ]
        info["cpu_model"] = models[0] if models else None
    except OSError:
        pass
    node = shutil.which("node")
    if node:
        done = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)  # noqa: S603
        info["node"] = done.stdout.strip()
    return info


def build(
    *,
    command: str,
    started_at: str,
    workload: Mapping[str, Any],
    environment: Mapping[str, Any],
    lines: Mapping[str, LineResult],
    soak: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "command": command,
        "started_at": started_at,
        "machine": machine(),
        "environment": dict(environment),
        "workload": dict(workload),
        "lines": {name: line.to_json() for name, line in lines.items()},
        "ratios": ratios(lines),
    }
    if soak is not None:
        record["soak"] = dict(soak)
    record["targets"] = {o.goal.key: o.to_json() for o in targets.evaluate(record["ratios"], soak)}
    record["score"] = targets.score_json(record["ratios"], record["lines"])
    return record


def write(record: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def table(lines: Mapping[str, LineResult]) -> str:
    return render_table(lines, ratios(lines))
