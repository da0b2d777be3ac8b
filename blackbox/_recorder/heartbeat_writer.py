"""The rank's heartbeat writer: a few aligned 8-byte stores into an mmap per update, no syscall, no lock.
Stdlib only, Python >= 3.9: loaded inside the job's interpreter. The host side's decoder is
blackbox.heartbeat_reader."""

from __future__ import annotations

import mmap
import os
import sys
import time

from . import protocol as P

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:  # annotations only
    from typing import Callable, Optional


class HeartbeatWriter:
    """Owned by one rank. Each group has one writer thread: progress and phase the thread that runs the
    job's loop, liveness the daemon thread."""

    # slots: phase() runs twice a collective call, with its code and data cold (see Recorder; the step hook writes
    # the progress group itself)
    __slots__ = ("_d", "_ledger_word", "_ledger_words", "_mv", "_phase_start", "_phv", "_q", "_ring", "_ring_n",
                 "issued", "mm", "mono0", "wall0")  # fmt: skip

    def __init__(
        self, path: str, *, pid: int, start_ticks: int, rank: int, local_rank: int, world_size: int, mode: str
    ) -> None:
        if sys.byteorder != "little":
            raise RuntimeError("the heartbeat layout is little-endian; this machine is not")
        tmp = "%s.%d.tmp" % (path, pid)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # The page is written for real before it is mapped: a sparse file (ftruncate) on a full or over-quota
            # filesystem would raise SIGBUS at the first store and kill the rank. Here it is an OSError, and the
            # recorder stays off in this rank.
            zeros = memoryview(bytes(P.HEARTBEAT_SIZE))
            while zeros:
                zeros = zeros[os.write(fd, zeros) :]
            self.mm = mmap.mmap(fd, P.HEARTBEAT_SIZE)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        os.close(fd)
        self.wall0 = time.time()
        self.mono0 = time.monotonic()
        self._q = memoryview(self.mm).cast("Q")  # one machine store per item assignment
        self._d = memoryview(self.mm).cast("d")
        self._phv = 0  # group versions; 0 is never written as a version (the progress group's is its own first word)
        self._mv = 0
        self._ring_n = 0  # the ring's last entry written
        self._ring = P.RING_ENTRY.pack_into
        # torch's count of the collectives issued on the default group (a bound C++ getter, ~0.2 µs), set while the
        # rank has joined one: each ring entry holds it (protocol's ring)
        self.issued: Optional[Callable[[], int]] = None
        # the time ledger, kept by the phase writes themselves: the word of the phase now written, since when
        self._ledger_words = [P.W_LEDGER + P.ledger_slot(code) for code in range(P.PHASE_CUSTOM + 1)]
        self._ledger_word = self._ledger_words[P.PHASE_STARTUP]
        self._phase_start = self.mono0
        P.HEADER.pack_into(self.mm, P.OFF_HEADER, P.MAGIC, P.HEARTBEAT_VERSION, P.HEARTBEAT_SIZE)
        P.IDENT.pack_into(
            self.mm, P.OFF_IDENT, pid, start_ticks, rank, local_rank, world_size,
            P.MODE_CODES.get(mode, 0), self.wall0, self.mono0,
        )  # fmt: skip
        self.progress(0, self.mono0, 0.0, 0.0)
        self.phase(P.PHASE_STARTUP, self.mono0, 0, 0)
        self.liveness(0, self.mono0)
        self.motion(0, 0.0, 0, 0.0, P.FORWARDS_IDLE)
        os.replace(tmp, path)  # readers only ever see a complete header

    def progress(self, step: int, now: float, step_dt: float, slowest_dt: float) -> None:
        """The progress group. In a rank, this is its first write and a DataLoader batch's: the step hook
        (Recorder._on_step) writes the group itself, in this layout: change the two together. Its version is the
        group's first word plus one, so every writer of the group counts from the same number."""
        q, d = self._q, self._d
        v = q[8] + 1
        q[8] = v  # P.W_PROGRESS (literal indices: this runs on every training step)
        q[9] = step
        d[10] = now
        d[11] = step_dt
        d[12] = slowest_dt
        q[13] = v

    def phase(self, code: int, start: float, op: int, op_seq: int, name: bytes = b"") -> None:
        """The phase from `start` (now) on; the time of the phase it ends goes to that phase's ledger word."""
        q = self._q
        self._d[self._ledger_word] += start - self._phase_start
        self._ledger_word = self._ledger_words[code]
        self._phase_start = start
        v = self._phv + 1
        self._phv = v
        q[14] = v  # P.W_PHASE
        q[15] = code
        self._d[16] = start
        q[17] = op
        q[18] = op_seq
        if code == P.PHASE_CUSTOM:
            off = P.W_PHASE_NAME * 8
            self.mm[off : off + P.PHASE_NAME_BYTES] = name[: P.PHASE_NAME_BYTES].ljust(P.PHASE_NAME_BYTES, b"\0")
        q[23] = v
        # the ring's entry for this edge: one pack (P.RING_ENTRY at P.W_RING, RING_ENTRIES = 64 of 48 bytes: literal)
        issued = 0
        if self.issued is not None:
            try:
                issued = self.issued()
            except Exception:  # the group is gone or cannot say: the count stays 0 from here on
                self.issued = None
        n = self._ring_n + 1
        self._ring_n = n
        self._ring(self.mm, 512 + ((n - 1) & 63) * 48, n, code | op << 8 | q[9] << 16, op_seq, issued, start, n)

    def spent(self, now: float) -> list[float]:
        """Seconds in each ledger slot up to `now`: the ledger's words and the current phase's time since it began."""
        out: list[float] = self._d[P.W_LEDGER : P.W_LEDGER + len(P.LEDGER_PHASES)].tolist()  # type: ignore[assignment]
        out[self._ledger_word - P.W_LEDGER] += now - self._phase_start
        return out

    def shift(self, source: int, moves: list[tuple[int, float]]) -> None:
        """Move seconds from one ledger slot to others (a sampled estimate: see Recorder's stride). The additions go
        first: a reader between the stores sees a moment counted twice, never lost."""
        d = self._d
        for slot, seconds in moves:
            d[P.W_LEDGER + slot] += seconds
        d[P.W_LEDGER + source] -= sum(seconds for _, seconds in moves)

    def state(self, code: int) -> None:
        self._q[P.W_STATE] = code

    def liveness(self, counter: int, now: float) -> None:
        self._q[P.W_LIVENESS] = counter
        self._d[P.W_LIVENESS_TIME] = now

    def motion(self, forwards: int, forwards_time: float, stack_changes: int, stack_time: float, mode: int,
               waiting: int = P.WAIT_NONE) -> None:  # fmt: skip
        """Progress that is not a step (the liveness thread is this group's only writer), and what the main thread
        waits for (its own word)."""
        q, d = self._q, self._d
        q[P.W_WAITING] = waiting
        v = self._mv + 1
        self._mv = v
        q[P.W_MOTION] = v
        q[P.W_FORWARDS] = forwards
        d[P.W_FORWARDS_TIME] = forwards_time
        q[P.W_STACK_CHANGES] = stack_changes
        d[P.W_STACK_TIME] = stack_time
        q[P.W_FORWARD_MODE] = mode
        q[P.W_MOTION_END] = v

    def join(self, code: int) -> None:
        """Where the rank is in joining its process group (protocol.W_JOIN)."""
        self._q[P.W_JOIN] = code

    def dump_request(self) -> int:
        return int(self._q[P.W_DUMP_REQUEST])

    def dump_ack(self) -> int:
        return int(self._q[P.W_DUMP_ACK])

    def ack_dump(self, request: int) -> None:
        self._q[P.W_DUMP_ACK] = request

    def data(self, waited_total: float, batches: int) -> None:
        self._d[P.W_DATA_WAIT] = waited_total
        self._q[P.W_BATCHES] = batches
