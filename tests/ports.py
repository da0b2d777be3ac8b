"""Ports for the jobs the tests start: free now, and below the kernel's ephemeral range, so that no connection's own
port (a job's, a server's, another worker's) can take one between the test choosing it and the job binding it — a
Slurm job's TCPStore once failed so (EADDRINUSE) on a busy machine."""

from __future__ import annotations

import random
import socket

LOWEST = 10000


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(also: int = 0) -> int:
    """A port nothing listens on (bound and released here); with `also`, the port that many above it too (torchrun's
    master port and blackbox's coordination port, 1000 above)."""
    top = _ephemeral_floor() - 1 - also
    for _ in range(200):
        port = random.randint(LOWEST, max(LOWEST, top))
        if all(_free(p) for p in {port, port + also}):
            return port
    raise AssertionError("no free port below the ephemeral range")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
