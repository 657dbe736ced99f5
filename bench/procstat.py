"""CPU seconds and memory of a process, read from `/proc` (Linux), and where the local servers run.

`/proc/<pid>/stat` fields 14 and 15 are user and system time of all the process's threads, in clock ticks
(field 10 its minor page faults);
`/proc/<pid>/status` has `VmRSS` (resident now) and `VmHWM` (the peak resident size so far).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds the process has used; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces: split after its closing parenthesis
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def cpu_seconds_fine(pid: int) -> float | None:
    """`cpu_seconds` to the nanosecond: the process's CPU clock (Linux's per-process clock id for `pid`,
    `((~pid) << 3) | 2`, all of its threads, the exited ones too). `/proc/<pid>/stat` counts in clock ticks
    (10 ms), which a short window (the CI's quick run: B1 moves 120 records in ~10 ms) reads as 0 or 1 tick.
    None when the process is gone."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        return None


def minor_faults(pid: int) -> int | None:
    """Minor page faults of the process so far (`/proc/<pid>/stat` field 10), None when it is gone: each a
    fresh page touched, the cost glibc's malloc tunables move (docs/operations.md, runtime settings)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[7])


def _status_kb(pid: int, key: str) -> int | None:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def rss_bytes(pid: int) -> int | None:
    """Resident set size now."""
    kb = _status_kb(pid, "VmRSS")
    return kb * 1024 if kb is not None else None


def peak_rss_bytes(pid: int) -> int | None:
    """The largest resident set size the process has had (VmHWM)."""
    kb = _status_kb(pid, "VmHWM")
    return kb * 1024 if kb is not None else None


@dataclass(frozen=True)
class Servers:
    """The pids of the MongoDB-wire server and the Kafka broker on this machine, when found."""

    mongo: int | None
    kafka: int | None

    def cpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pid in (("mongo", self.mongo), ("kafka", self.kafka)):
            value = cpu_seconds(pid) if pid is not None else None
            if value is not None:
                out[name] = value
        return out


def find_servers(mongo_port: int | None) -> Servers:
    """Local `mongod` / SecantusDB (listening on `mongo_port` if its command line says) and `kafka.Kafka`.

    Only read, never touched: their CPU is reported beside each line. A server that is not local (or not
    unique) is None.
    """
    mongo: list[int] = []
    kafka: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = b" ".join(argv)
        if b"kafka.Kafka" in line and b"java" in argv[0]:
            kafka.append(int(entry.name))
        elif any(name in argv[0] for name in (b"secantusd", b"mongod")) and (
            mongo_port is None or str(mongo_port).encode() in line
        ):
            mongo.append(int(entry.name))
    return Servers(mongo=mongo[0] if len(mongo) == 1 else None, kafka=kafka[0] if len(kafka) == 1 else None)


def server_name(pid: int | None, build_info: Mapping[str, Any]) -> str:
    """What the MongoDB-wire server is, for the record: SecantusDB is named as itself, never as MongoDB.

    SecantusDB answers `buildInfo` with a MongoDB version (8.2.x) plus its own `secantusVersion`.
    """
    version = build_info.get("version")
    local = "local" if pid is not None else "not a local process"
    if "secantusVersion" in build_info:
        return f"SecantusDB/WiredTiger {build_info['secantusVersion']} (MongoDB {version} wire, {local})"
    return f"MongoDB {version} ({local})"
