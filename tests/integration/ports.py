"""Loopback ports for a server a test stops and starts again on the same port."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_FIXED_RANGE = (20_000, 32_000)  # below Linux's ephemeral range (32768-60999 by default)


def restartable_ports(count: int) -> list[int]:
    """Free loopback ports outside the kernel's ephemeral range. A port the kernel handed out (bind to 0) is
    an ephemeral port: once the broker stops, any client connection of any process may take it as its local
    port, and the restart on it fails (`BindException`, seen under a loaded suite). Ports below the range
    are never handed out to connections."""
    low, high = _FIXED_RANGE
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        high = min(high, first - 1)
    except (OSError, ValueError, IndexError):
        pass
    chosen: list[int] = []
    sockets = []
    try:
        while len(chosen) < count:
            port = random.randint(low, high)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
            chosen.append(port)
        return chosen
    finally:
        for sock in sockets:
            sock.close()


def restartable_port() -> int:
    return restartable_ports(1)[0]
