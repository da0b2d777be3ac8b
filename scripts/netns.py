"""Hosts on one machine, for the tests and the hang benchmark: network namespaces joined by a veth pair, each with an
address of its own; a command line that runs in one as a host of its own name (a UTS namespace, and an /etc/hosts
of its own in a private mount namespace); the link between them cut, and mended. Root only (`ip`, `unshare`).
Imports the stdlib only."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from typing import Optional


def available() -> bool:
    """Whether this process can make hosts: root, with `ip` and `unshare`."""
    return os.geteuid() == 0 and bool(shutil.which("ip") and shutil.which("unshare"))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[tuple[str, str], tuple[str, str]]]:
    """Two network namespaces joined by a veth pair: (namespace names, their addresses). Removed on the way out."""
    tag = f"bb{os.getpid() % 100000}{random.randrange(1000)}"
    ns = (f"{tag}a", f"{tag}b")
    net = f"10.{random.randrange(200, 250)}.{random.randrange(256)}"
    addrs = (f"{net}.1", f"{net}.2")
    try:
        for n in ns:
            _ip("netns", "add", n)
        _ip("link", "add", f"{tag}x", "type", "veth", "peer", "name", f"{tag}y")
        for n, dev, addr in ((ns[0], f"{tag}x", addrs[0]), (ns[1], f"{tag}y", addrs[1])):
            _ip("link", "set", dev, "netns", n)
            _ip("-n", n, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", n, "link", "set", dev, "up")
            _ip("-n", n, "link", "set", "lo", "up")
        yield ns, addrs
    finally:
        for n in ns:  # a namespace's devices go with it
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=20)


def on_host(ns: str, hostname: str, argv: list[str], hosts_file: Optional[str] = None) -> list[str]:
    """The command line that runs `argv` in namespace `ns` on a host named `hostname` (with `hosts_file` as its
    /etc/hosts when given)."""
    script = f"hostname {hostname}"
    if hosts_file:
        script += f" && mount --bind {hosts_file} /etc/hosts"
    script += ' && exec "$@"'
    return ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", script,
            hostname, *argv]  # fmt: skip


def cut(ns: str) -> None:
    """Take namespace `ns`'s end of the veth pair down: from now on nothing passes between the hosts, and neither
    side is told (no reset, no error: a switch port or a cable gone)."""
    _ip("-n", ns, "link", "set", _link(ns), "down")


def mend(ns: str) -> None:
    """Bring namespace `ns`'s end of the veth pair up again (the switch port back)."""
    _ip("-n", ns, "link", "set", _link(ns), "up")


def _link(ns: str) -> str:
    links = subprocess.run(["ip", "-n", ns, "-o", "link"], capture_output=True, text=True, check=True, timeout=20)
    return next(w.split("@")[0] for w in links.stdout.split() if w.startswith("bb"))
