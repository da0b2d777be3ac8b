"""The TCP sockets of this host's network namespace, read from the kernel through sock_diag (netlink): each one's
endpoints, inode, and the bytes it has carried (tcp_info's bytes_acked and bytes_received: what the peer took and
what arrived, not what was queued) — the counts that /proc/PID/io lacks for send() and recv(). Imports the stdlib."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from typing import Optional

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2  # the attribute that carries struct tcp_info
TCP_LISTEN = 10
STATES = 0xFFF & ~(1 << TCP_LISTEN)  # every state but LISTEN (a listening socket carries nothing)
DIAG_MSG = struct.Struct("=BBBB2H16s16sI2I5I")  # struct inet_diag_msg: 72 bytes
BYTES_AT = 120  # tcp_info's tcpi_bytes_acked, then tcpi_bytes_received (u64 each; Linux >= 4.1 and 4.2)
MAX_SOCKETS = 1 << 17  # a host with more is read this far: the read stays bounded
RECV_TIMEOUT_S = 2.0

Endpoint = tuple[str, int]


@dataclass(frozen=True)
class TcpSocket:
    inode: int
    local: Endpoint
    remote: Endpoint
    carried: int  # bytes the peer acknowledged plus bytes received, since the socket opened
    unsent: int = 0  # bytes written that the peer has not acknowledged yet (the send queue)
    unread: int = 0  # bytes received that the process has not read yet (the receive queue)


def tcp_sockets() -> Optional[dict[int, TcpSocket]]:
    """Every TCP socket not listening, by inode; None where sock_diag cannot be read (no netlink, another kernel)."""
    out: dict[int, TcpSocket] = {}
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(RECV_TIMEOUT_S)
            for family in (socket.AF_INET, socket.AF_INET6):
                if not _dump(nl, family, out):
                    return None
    except OSError:
        return None
    return out


def _dump(nl: socket.socket, family: int, out: dict[int, TcpSocket]) -> bool:
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, STATES) + bytes(48)
    nl.sendto(struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
              + request, (0, 0))  # fmt: skip
    while True:
        data = nl.recv(1 << 16)
        at = 0
        while at + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, at)
            if kind == NLMSG_DONE:
                return True
            if kind == NLMSG_ERROR or length < 16:
                return False
            if len(out) < MAX_SOCKETS:
                found = _socket(data[at + 16 : at + length], family)
                if found is not None:
                    out[found.inode] = found
            at += (length + 3) & ~3
        if not data:
            return False


def _socket(msg: bytes, family: int) -> Optional[TcpSocket]:
    if len(msg) < DIAG_MSG.size:
        return None
    fields = DIAG_MSG.unpack_from(msg)
    sport, dport, src, dst, inode = socket.ntohs(fields[4]), socket.ntohs(fields[5]), fields[6], fields[7], fields[15]
    unread, unsent = fields[12], fields[13]
    carried = 0
    at = DIAG_MSG.size
    while at + 4 <= len(msg):
        size, kind = struct.unpack_from("=HH", msg, at)
        if size < 4:
            break
        if kind == INET_DIAG_INFO and size - 4 >= BYTES_AT + 16:
            acked, received = struct.unpack_from("=QQ", msg, at + 4 + BYTES_AT)
            carried = acked + received
        at += (size + 3) & ~3
    if not inode:
        return None
    return TcpSocket(inode, (_ip(family, src), sport), (_ip(family, dst), dport), carried, unsent, unread)


def _ip(family: int, raw: bytes) -> str:
    """The address in its usual form; an IPv4 address mapped into IPv6 as IPv4 (one socket, one spelling)."""
    if family == socket.AF_INET:
        return socket.inet_ntop(family, raw[:4])
    ip = ipaddress.IPv6Address(raw[:16])
    return str(ip.ipv4_mapped) if ip.ipv4_mapped else str(ip)


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets a process holds open (its /proc/PID/fd links `socket:[N]`); empty when unreadable."""
    out: set[int] = set()
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"{base}/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            try:
                out.add(int(target[8:-1]))
            except ValueError:
                pass
    return out


MAX_LISTED = 64  # a process's sockets listed in a snapshot, those holding the most unsent bytes first


def of_process(pid: int, sockets: dict[int, TcpSocket]) -> list[dict[str, object]]:
    """A process's TCP sockets (`sockets`: tcp_sockets()) for its /proc snapshot: each one's endpoints and queues."""
    mine = sorted((sockets[i] for i in socket_inodes(pid) if i in sockets), key=lambda s: -s.unsent)[:MAX_LISTED]
    return [{"inode": s.inode, "local": f"{s.local[0]}:{s.local[1]}", "peer": endpoint(s.remote), "unsent": s.unsent,
             "unread": s.unread, "carried": s.carried} for s in mine]  # fmt: skip


def endpoint(e: Endpoint) -> str:
    """`10.0.0.7:9000`, `[fe80::1]:9000`."""
    return f"[{e[0]}]:{e[1]}" if ":" in e[0] else f"{e[0]}:{e[1]}"
