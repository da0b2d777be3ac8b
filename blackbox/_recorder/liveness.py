"""The recorder's liveness thread: a tick every half second (the heartbeat's liveness counter, the stride's pause,
the motion sample, the job's annotations and metrics, a dump asked for, the state files), and stepping aside when a
rank this process started records instead. Stdlib only; imports protocol, and dumps on its own thread."""

from __future__ import annotations

import os
import threading
import time

from . import protocol as P
from .stride import STRIDE_PAUSE_S

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:  # annotations only
    from .seam import LiveRecorder


def liveness_loop(rec: LiveRecorder) -> None:
    """The thread's body, until the recorder stops, is switched off, or steps aside."""
    try:  # its name in the kernel too, for `top -H`, py-spy and the overhead bench's ledger (15 bytes at most)
        with open("/proc/self/task/%d/comm" % threading.get_native_id(), "w") as f:
            f.write("blackbox-live")
    except (OSError, AttributeError):
        pass
    from .dumps import serve_dump_request, write_state_files  # on this thread: never at the job's start

    counter = 0
    while not rec._stop.is_set():
        try:
            if not rec.enabled:
                return
            counter += 1
            if rec.mode in (P.MODE_SINGLE, P.MODE_SLURM) and _taken_over(rec):
                return
            now = time.monotonic()
            rec.hb.liveness(counter, now)
            if rec._striding and now - rec._last_step_time > STRIDE_PAUSE_S:
                rec.guard("stride", rec._pause_seen, now)
            rec.motion.tick(now)
            if "flush" not in rec._failed:
                try:
                    rec.flush()
                except Exception as exc:
                    rec.fail("flush", exc)
            rec.guard("dump", serve_dump_request, rec)
            # every few ticks (and at once when torch has just been imported): facts the collector wants before
            # anything happens
            if counter % 4 == 1 or (rec.torch is not None and not rec._versions_written):
                rec.guard("state_files", write_state_files, rec)
        except Exception as exc:
            rec.fail("liveness", exc)
            return
        rec._stop.wait(rec._liveness_interval)


def _taken_over(rec: LiveRecorder) -> bool:
    """A single process that started the job's ranks itself (torch.multiprocessing.spawn): once its rank 0 records,
    it has replaced this process's heartbeat. This process is their launcher: it steps aside."""
    try:
        current = os.stat(rec.hb_path).st_ino
    except FileNotFoundError:  # a Slurm task's spawned rank of another number retired this one (retire_parent)
        current = 0 if rec.mode == P.MODE_SLURM else rec.hb_ino
    except OSError:
        return False
    if current == rec.hb_ino:
        return False
    rec.enabled = False
    rec.lastwords.note("stepped_aside", reason="rank 0 of the ranks this process started records now")
    rec.lastwords.step_aside()
    return True
