"""What moves in a rank besides its steps and batches: the main thread's Python stack changing between two samples
while it works (or, while it waits for a thread of its own or polls, another thread's), and the main thread's forward
calls counted during a pause. Both run on the recorder's liveness thread, one sample a tick (a few µs);
the training step pays nothing. Stdlib only, Python >= 3.9: loaded inside the job's interpreter."""

from __future__ import annotations

import opcode
import os
import sys
import threading
import time

from . import protocol as P

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:  # annotations only
    from typing import Any, Optional

STACK_DEPTH = 32  # innermost frames of the main thread compared between two samples
_DEPTH = range(STACK_DEPTH)
# where the interpreter checks for a GIL hand-over between bytecodes (3.9-3.10: a backward jump is JUMP_ABSOLUTE)
RUNNING_OPS = frozenset(("JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "RESUME"))
# Their numbers in this interpreter, read at import (in the main thread): no `dis` imported on the liveness thread.
_RUNNING_CODES = frozenset(opcode.opmap[name] for name in RUNNING_OPS if name in opcode.opmap)
FORWARD_HOOK_AFTER_S = 5.0  # a pause (no step, no batch) this long: forward calls are counted until the next one
# Where a main thread waits for another thread of its own: (file suffix, function) of its innermost frame — a join,
# a future's result, a queue's get, an event or a condition, or the interpreter's exit, which joins every non-daemon
# thread (threading._shutdown: a last checkpoint uploaded from a thread). Then the other threads' stacks are its motion.
THREAD_WAITS = frozenset((("threading.py", "wait"), ("threading.py", "join"), ("threading.py", "_wait_for_tstate_lock"),
                          ("threading.py", "_shutdown"),
                          ("concurrent/futures/_base.py", "result"), ("concurrent/futures/_base.py", "wait"),
                          ("queue.py", "get"), ("queue.py", "join")))  # fmt: skip
# Where a thread sleeps on a timer (`time.sleep`; a select or poll on no descriptor), by machine: system call number
# (/proc/self/task/TID/syscall) -> the argument that counts the descriptors, which must be 0 (None: any arguments).
CLOCK_NANOSLEEP = {"x86_64": 230, "aarch64": 115}  # with TIMER_ABSTIME, Python >= 3.11's time.sleep: its deadline is
# the same across a signal's interruptions of one sleep (a retry), new at each sleep of a loop
TIMER_SLEEPS = {"x86_64": {35: None, 230: None, 23: 0, 270: 0, 7: 1, 271: 1},
                "aarch64": {101: None, 115: None, 72: 0, 73: 1}}  # fmt: skip
CPU_FLOOR = 0.02  # a stack change is work when its thread used this share of a CPU since the sample before ...
POLL_S = 10.0  # ... or, for the main thread, when it has not slept on a timer for this long: a poll loop's wake-ups
BACKOFF_GROWTH = 1.5  # a loop two of whose wake-ups come surely this much further apart than its closest two may
BACKOFF_MIN_S = 3.0  # have, and this far or more, backs off (a retry's timer, doubling or jittered): a sleep, not a
# poll, to the loop's end — a jittered retry's wait may come short. A wake-up lies between the last sample that found
# the thread asleep and the one that finds it woken: gaps are bounded, never taken from the samples' times alone, so a
# sampler late on a loaded machine widens a bound and never makes a steady loop's gap look grown (nor its closest two
# closer).
NATIVE_SHARE = 0.25  # a main thread standing in one call while it used this share of a CPU works there (hashing, a
# tokenizer, zlib), on a rank with no accelerator: a CUDA sync or an accelerator's wait spins a core as busily
ACCELERATOR_MODULES = ("torch_npu", "habana_frameworks", "torch_xla")  # loaded: the rank may spin in their waits


class Motion:
    """Owned by the recorder, driven by its liveness thread (`tick`), the heartbeat's motion group's only writer.

    The stack: the innermost frames' code objects and instruction offsets, compared with the sample before. A thread
    blocked in a C call (a collective, a `read`, a CUDA sync) or sleeping at one line shows the same frames at every
    sample; a thread walking through Python code (evaluation, metrics, a retry loop) does not. A tight loop that
    calls nothing hands the GIL over at its back-edge every time, so it shows the same frames too: a sample that
    finds the innermost frame at a loop's back-edge or a function's start (where only a thread running bytecode
    stops: never one in a C call) counts as a change as well. A thread holding the GIL lets no sample be taken at
    all: it does not move, and its liveness stops (the frozen rule).

    Native work: a main thread whose every sample finds it in the same call — a loop of GIL-releasing native calls
    (hashing shards, a tokenizer's batch encode, zlib, one CPU op per iteration) — moves when it used NATIVE_SHARE
    of a CPU since the sample before, on a rank that has not initialized CUDA or another accelerator (whose waits
    spin a core while nothing moves: there CPU time never counts).

    Waking is not moving. A poll loop — sleep, check a lock file, a store key or a marker file, sleep again — changes
    its stack between samples while it waits for something else: a change counts only when its thread used CPU
    meanwhile (CPU_FLOOR; a poll's wake-ups use a fraction of a percent), or, for the main thread, when it has not
    slept on a timer within POLL_S and waits for no thread (a loop of blocking calls that each return with data —
    requests to a server — wakes on data, not on a timer). While the main thread waits for another thread of the
    job (a join, a future's result, a queue's get, an event: THREAD_WAITS) or sleeps (it slept on a timer within
    POLL_S: a poll loop when it used CPU between two such samples, a plain sleep when not — or when its wake-ups
    grow apart, as a retry's backoff does: BACKOFF_GROWTH), the other threads
    count: one whose stack changes while it uses CPU, or whose bytes through read and
    write system calls move — the rank is as alive as the thread it waits for; which one is not known, so any
    does. blackbox's own threads never count. What the main thread waits for is published (W_WAITING): the
    supervisor then follows the rank's worker processes as well.

    Forward calls count only from the main thread, the one whose stack is sampled: an EMA or teacher model run in
    another thread says nothing about a hung training loop.

    The forward counter: a global forward pre-hook makes every module call of the job take torch's slower path (about
    0.9 µs more a call, measured): it is installed only once the rank has gone FORWARD_HOOK_AFTER_S without a step or
    batch, and removed at the next one, so a training loop never runs with it. Never while torch.compile is in use
    (`torch.compile` called, or dynamo has converted a frame): dynamo guards on the global hooks, and a hook coming
    and going would make it recompile. The recorder wraps `torch.compile` to know (DDP imports dynamo without
    compiling anything)."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.main: Any = None
        self._syscall = ""
        self._status = ""
        self.watch(threading.main_thread())
        self._sleeps = TIMER_SLEEPS.get(os.uname().machine, {})
        self._clock_nanosleep = CLOCK_NANOSLEEP.get(os.uname().machine, -1)
        self._signature: tuple[Any, ...] = ()
        self._at = 0.0  # the sample before: when, and the main thread's CPU seconds then
        self._cpu = -1.0
        self._slept_at = -POLL_S  # when the main thread was last seen asleep on a timer, its CPU seconds then ...
        self._slept_cpu = -1.0
        self._slept_switches = -1  # (and how many times it had switched out: a wake-up is counted once it slept again,
        self._slept_until: Optional[bytes] = None  # and the deadline it slept to, where known)
        self._polled_at = -POLL_S  # ... and having woken (used CPU) since then: a loop
        self._woke_in: Optional[tuple[float, float]] = None  # the loop's last wake-up: after, and by (samples' times)
        self._closest = float("inf")  # the most two wake-ups of this loop can have been apart, at the closest
        self._backed_off = False  # a gap of this loop grew (BACKOFF_GROWTH): it backs off, to its end
        self._was_asleep: Optional[bool] = None  # the main thread was asleep on a timer at the sample before (None:
        # not known — it was running, or waiting for a CPU on a loaded machine: asked again)
        self.waiting = P.WAIT_NONE  # what the main thread waits for (P.WAIT_*), at the last sample
        self._accelerated = False  # CUDA or another accelerator is in use: CPU time in one call is no work
        # the job's other threads while the main thread waits for one: thread id -> (signature, bytes, CPU s)
        self._others: dict[int, tuple[tuple[Any, ...], int, float]] = {}
        self._codes_seen: dict[int, tuple[Any, frozenset[int], bool]] = {}  # id(code) -> _code_facts(code)
        self.stack_changes = 0
        self.stack_time = 0.0
        self.forwards = 0  # incremented by the hook in whichever thread runs a module, read here
        self._forwards_seen = 0
        self.forwards_time = 0.0
        self._handle: Any = None
        self.mode = P.FORWARDS_IDLE
        self._progress: Any = None  # (steps, batches) at the last tick
        self._progress_at = 0.0
        self.compiling = False  # the job called torch.compile: the forward counter stays off for good
        self._mover = 0  # the native id of the other thread named last as keeping the waiting main thread alive

    def watch(self, thread: threading.Thread) -> None:
        """Take `thread` for the main thread (the job's; a test's stand-in)."""
        self.main = thread.ident
        self._syscall = "/proc/self/task/%s/syscall" % thread.native_id
        self._status = "/proc/self/task/%s/status" % thread.native_id

    def watch_compile(self, torch: Any) -> None:
        """Wrap `torch.compile` (the function, as the job and `nn.Module.compile` call it) to learn that the job
        compiles; the call itself is unchanged."""
        import functools

        fn = getattr(torch, "compile", None)
        if fn is None or getattr(fn, "__blackbox_wrapped__", False):
            return

        @functools.wraps(fn)
        def compile(*args: Any, **kwargs: Any) -> Any:
            self.compiling = True
            return fn(*args, **kwargs)

        compile.__blackbox_wrapped__ = True  # type: ignore[attr-defined]
        torch.compile = compile

    def tick(self, now: float) -> None:
        rec = self.rec
        if "stack_motion" not in rec._failed:
            try:
                self._sample(now)
            except Exception as exc:
                rec.fail("stack_motion", exc)
        if "forwards" not in rec._failed:
            try:
                self._pace_forwards(now)
            except Exception as exc:
                rec.fail("forwards", exc)
                self.mode = P.FORWARDS_OFF
                self._unhook()
        forwards = self.forwards
        if forwards != self._forwards_seen:
            self._forwards_seen = forwards
            self.forwards_time = now
        rec.hb.motion(forwards, self.forwards_time, self.stack_changes, self.stack_time, self.mode, self.waiting)

    def _still(self, now: float, sig: tuple[Any, ...], cpu: float) -> None:
        """A sample of a main thread that did no work since the one before: whether it sleeps on a timer, and whether
        it woke meanwhile and sleeps again (a loop's wake-up)."""
        # the same instruction of the same frames as the sample before, and no CPU time since: the same call as then
        # — asleep on a timer or not — without asking the kernel again (a still rank's sample stays cheap). A thread
        # that used CPU is asked: woken from its sleep, it stands at the same instruction until it runs Python again
        # (waiting for the GIL, or for a CPU on a loaded machine)
        before = self._was_asleep
        if before is None or sig != self._signature or cpu != self._cpu:
            (asleep, until), switches = self._asleep(), self._switches()
        else:
            asleep, switches, until = before, self._slept_switches, self._slept_until  # no CPU time: no switch either
        self._was_asleep = asleep  # a thread found running is asked again: it may be on its way into the sleep
        if not asleep:
            return
        # it ran since the last sample that found it asleep, within POLL_S: it woke to check and sleeps again (a
        # loop) — not the rest of a step before its first sleep (one long sleep is no loop). Asleep again means
        # switched out again (voluntarily): a thread woken but not yet run stands in its sleep's system call too, and
        # is counted once it has slept again (counted then and again after, its wake-up made two)
        if now - self._slept_at <= POLL_S and cpu > self._slept_cpu >= 0:
            if 0 <= switches == self._slept_switches:
                return  # woken, not asleep again yet: the last sample that found it asleep stays the bound
            if until is None or until != self._slept_until:  # (the same deadline: one sleep a signal interrupted)
                self._polled_at = now
                self._woke(self._slept_at, now)
        self._slept_at, self._slept_cpu, self._slept_switches, self._slept_until = now, cpu, switches, until

    def _switches(self) -> int:
        """How many times the main thread has given up its CPU to wait (voluntary context switches); -1 where that
        cannot be read."""
        try:
            fd = os.open(self._status, os.O_RDONLY)
            try:
                text = os.read(fd, 4096)
            finally:
                os.close(fd)
            at = text.index(b"\nvoluntary_ctxt_switches:") + 26
            return int(text[at : text.index(b"\n", at)])
        except (OSError, ValueError):
            return -1

    def _woke(self, after: float, by: float) -> None:
        """A wake-up of the main thread's timer loop, after the sample at `after` and by the one at `by`: whether
        it came surely further apart from the one before than the loop's closest two may have (BACKOFF_GROWTH) — the
        loop backs off (a retry's backoff, a rate limit's wait): it sleeps on a timer more than it checks, and its
        wait is an ambiguous one (a sleep), not a poll loop's (which checks at a steady pace: no gap grows so)."""
        if self._woke_in is not None and not self._backed_off:
            first, last = self._woke_in
            self._backed_off = after - last >= max(BACKOFF_MIN_S, BACKOFF_GROWTH * self._closest)
            self._closest = min(self._closest, by - first)
        self._woke_in = (after, by)

    def _sample(self, now: float) -> None:
        frames = sys._current_frames()
        sig, running = self._read(frames.get(self.main))
        cpu = _cpu_seconds(self.main)
        floor = CPU_FLOOR * (now - self._at)
        worked = cpu < 0 or (self._cpu >= 0 and cpu - self._cpu >= floor)  # unreadable: every change counts
        if not worked:
            self._still(now, sig, cpu)
        else:
            self._was_asleep = None  # it worked: not known, asked again at the next still sample
        thread_wait = bool(sig) and self._code_facts(sig[0])[2]
        sleeps = now - self._slept_at <= POLL_S
        if not sleeps and self._woke_in is not None:  # out of the loop: the next one's pace is its own
            self._woke_in, self._closest, self._backed_off = None, float("inf"), False
        changed = (sig != self._signature and bool(self._signature)) or running  # the first sample: nothing to differ
        moved = changed and (worked or not (sleeps or thread_wait))
        if not changed and self._cpu >= 0 and cpu - self._cpu >= NATIVE_SHARE * (now - self._at):
            moved = not self._on_accelerator()  # a native call, or one after another, that computes
        polls = now - self._polled_at <= POLL_S and not self._backed_off
        self.waiting = (P.WAIT_THREAD if thread_wait else P.WAIT_NONE if not sleeps else
                        P.WAIT_POLL if polls else P.WAIT_SLEEP)  # fmt: skip
        others = self._read_others(frames) if self.waiting else {}
        frames = {}  # no frame outlives the sample: a frame held keeps its locals (tensors) alive
        if others and not moved:  # the rank is as alive as a thread of its own that works (a new one: baseline)
            mover = next((t for t, (other, io, cpu_t, running) in others.items() if t in self._others
                          and _works(self._others[t], other, io, cpu_t, running, floor)), None)  # fmt: skip
            moved = mover is not None
            paused = now - self._progress_at >= FORWARD_HOOK_AFTER_S  # in a pause: a step's waits are not named
            if mover is not None and paused and "mover" not in self.rec._failed:
                try:
                    self._note_mover(mover, now)
                except Exception as exc:
                    self.rec.fail("mover", exc)
        if moved:
            self.stack_changes += 1
            self.stack_time = now
        self._signature, self._at, self._cpu = sig, now, cpu
        self._others = {t: v[:3] for t, v in others.items()}

    def _note_mover(self, ident: int, now: float) -> None:
        """Name the thread that keeps the waiting main thread alive, for the supervisor's words (P.RANK_MOVER): its
        native id, name, and its bytes when it took over. Written when the mover changes, not at every sample."""
        thread = threading._active.get(ident)  # type: ignore[attr-defined]
        native = getattr(thread, "native_id", None)
        if thread is None or native is None or native == self._mover:
            return
        self._mover = native
        read, written = _thread_io(native)
        from .lastwords import write_json

        write_json(os.path.join(self.rec.rank_dir, P.RANK_MOVER),
                   {"tid": native, "name": thread.name, "at": now, "read": read, "written": written})  # fmt: skip

    def _on_accelerator(self) -> bool:
        """Whether the rank uses CUDA or another accelerator (once it does, for good)."""
        if not self._accelerated:
            torch = self.rec.torch
            try:
                xpu = getattr(torch, "xpu", None) if torch is not None else None
                self._accelerated = any(m in sys.modules for m in ACCELERATOR_MODULES) or (torch is not None and (
                    torch.cuda.is_initialized() or bool(xpu is not None and xpu.is_initialized())))  # fmt: skip
            except Exception:
                self._accelerated = True  # not known: CPU time does not count, as before
        return self._accelerated

    def _asleep(self) -> tuple[Optional[bool], Optional[bytes]]:
        """Whether the main thread sleeps on a timer now (TIMER_SLEEPS): False in another system call, None where
        that is not known (running — on a loaded machine a sample lands between the sleep's line and its system
        call, or while the thread waits for a CPU — or unreadable); and its sleep's deadline, where known."""
        try:
            fd = os.open(self._syscall, os.O_RDONLY)  # plain system calls: a file object costs as much as the read
            try:
                fields = os.read(fd, 256).split()
            finally:
                os.close(fd)
            nr = int(fields[0])
        except (OSError, ValueError, IndexError):
            return None, None  # "running", or no such file (another kernel)
        until = self._deadline(fields) if nr == self._clock_nanosleep else None
        if nr not in self._sleeps:
            return False, until
        count = self._sleeps[nr]
        return count is None or (len(fields) > count + 1 and int(fields[count + 1], 16) == 0), until

    @staticmethod
    def _deadline(fields: list[bytes]) -> Optional[bytes]:
        """The deadline of a clock_nanosleep with TIMER_ABSTIME (its third argument points at it), read from this
        process's memory through /proc/self/mem — where the address is no longer mapped the read fails, it never
        faults; None for a relative sleep, or where it cannot be read."""
        try:
            if not int(fields[2], 16) & 1:  # TIMER_ABSTIME
                return None
            fd = os.open("/proc/self/mem", os.O_RDONLY)
            try:
                return os.pread(fd, 16, int(fields[3], 16)) or None
            finally:
                os.close(fd)
        except (OSError, ValueError, IndexError, OverflowError):
            return None

    def _read(self, frame: Any) -> tuple[tuple[Any, ...], bool]:
        """A thread's innermost frames as the signature compared between samples — their code objects and instruction
        offsets, in turn — and whether it stands where only a thread running bytecode stops. The code objects
        themselves, not their ids: held by the signature, and the same object compares equal at once (two distinct
        code objects compare equal only when made of the same source at the same line: no sample tells them apart)."""
        signature: list[Any] = []
        add = signature.append  # bound once: this loop is most of a still rank's sample
        for _ in _DEPTH:
            if frame is None:
                break
            add(frame.f_code)
            add(frame.f_lasti)
            frame = frame.f_back
        sig = tuple(signature)
        return sig, bool(sig) and sig[1] in self._code_facts(sig[0])[1]

    def _read_others(self, frames: dict[int, Any]) -> dict[int, tuple[tuple[Any, ...], int, float, bool]]:
        """The other Python threads of the job (not the main one, not blackbox's): thread id -> (signature, bytes
        through its read and write system calls, CPU seconds, running). The bytes: an upload over TLS or a checkpoint
        written to a pipe or a FUSE mount moves them while its stack stands still inside one call."""
        ours = threading.get_ident()
        out = {}
        for ident, frame in frames.items():
            thread = threading._active.get(ident)  # type: ignore[attr-defined]
            if ident in (self.main, ours) or thread is None or thread.name.startswith("blackbox"):
                continue
            sig, running = self._read(frame)
            out[ident] = (sig, _thread_bytes(getattr(thread, "native_id", None)), _cpu_seconds(ident), running)
        return out

    def _code_facts(self, code: Any) -> tuple[Any, frozenset[int], bool]:
        """What a sample asks of a frame's code object, once per code object: (the code, held so that its id is never
        reused; the offsets where a thread stops only while it runs bytecode — loop back-edges and the function's
        start, where the interpreter hands the GIL over, never a call into C; whether it is a wait for a thread)."""
        facts = self._codes_seen.get(id(code))
        if facts is None or facts[0] is not code:
            raw = code.co_code  # two bytes an instruction (3.6 and later): the opcode, then its argument
            running = frozenset(i for i in range(0, len(raw) - 1, 2) if raw[i] in _RUNNING_CODES)
            if len(self._codes_seen) >= 512:
                self._codes_seen.clear()
            facts = self._codes_seen[id(code)] = (code, running, _waits_for_thread(code))
        return facts

    def _pace_forwards(self, now: float) -> None:
        """Install the forward counter in a pause, remove it at the next step or batch (or for good once
        torch.compile is in use)."""
        rec = self.rec
        progress = (rec.step_count, rec._batches)
        if progress != self._progress:
            self._progress, self._progress_at = progress, now
            self._mover = 0  # the next pause names its own
            if self._handle is not None:
                self._unhook()
                self.mode = P.FORWARDS_IDLE
            return
        torch = rec.torch
        if torch is None or self.mode == P.FORWARDS_OFF:
            return
        if self.compiling or _dynamo_converted():
            self._unhook()
            self.mode = P.FORWARDS_OFF
            return
        if self._handle is None and now - self._progress_at >= FORWARD_HOOK_AFTER_S:
            modules = getattr(getattr(torch, "nn", None), "modules", None)
            register = getattr(getattr(modules, "module", None), "register_module_forward_pre_hook", None)
            if register is None:
                raise RuntimeError("this torch has no register_module_forward_pre_hook: forward calls are not counted")
            self._handle = register(self._count)
            self.mode = P.FORWARDS_COUNTING

    def _count(self, module: Any, args: Any) -> None:
        if threading.get_ident() == self.main:  # the training loop's thread: another's module (an EMA, a teacher
            self.forwards += 1  # model, an evaluation thread) says nothing about whether the main thread is hung

    def _unhook(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()


def _waits_for_thread(code: Any) -> bool:
    """Whether a main thread's innermost frame is a wait for another thread (THREAD_WAITS)."""
    name = code.co_name
    return any(code.co_filename.endswith(f) and name == fn for f, fn in THREAD_WAITS)


def _works(before: tuple[Any, ...], sig: tuple[Any, ...], io: int, cpu: float, running: bool, floor: float) -> bool:
    """Whether another thread worked since its sample `before` (signature, bytes, CPU s): bytes moved, or its stack
    changed while it used CPU (a thread that wakes to poll a queue or its workers does not)."""
    return io != before[1] or ((running or sig != before[0]) and (cpu < 0 or cpu - before[2] >= floor))


def _cpu_seconds(ident: Any) -> float:
    """The CPU time a thread of this process has used (its pthread CPU clock); -1 where it cannot be read."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (OSError, AttributeError, OverflowError, TypeError):
        return -1.0


def _thread_bytes(native_id: Any) -> int:
    """rchar + wchar of one thread of this process (/proc/self/task/TID/io); -1 where it cannot be read."""
    if native_id is None:
        return -1
    read, written = _thread_io(native_id)
    return read + written if read >= 0 and written >= 0 else -1


def _thread_io(native_id: int) -> tuple[int, int]:
    """(rchar, wchar) of one thread of this process; -1 each where they cannot be read."""
    try:
        with open("/proc/self/task/%d/io" % native_id, "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read(1024).splitlines() if b":" in line)
        return int(fields[b"rchar"]), int(fields[b"wchar"])
    except (OSError, KeyError, ValueError):
        return -1, -1


def _dynamo_converted() -> bool:
    """Whether dynamo has converted any frame in this process (torch.compile, torch._dynamo.optimize, export)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if not isinstance(counters, dict):
        return False
    frames = counters.get("frames")
    return bool(frames and frames.get("total"))
