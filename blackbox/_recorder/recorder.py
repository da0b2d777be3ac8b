"""The rank recorder: keeps this rank's heartbeat, counts steps and phases with zero code change, and never
hurts the job (every hook guarded: a failure is logged once to the rank's log and switches that hook off).
Stdlib only, Python >= 3.9; torch is touched only after the job itself imports it."""

from __future__ import annotations

import atexit
import os
import threading
import time

from . import protocol as P
from .heartbeat_writer import HeartbeatWriter
from .importwatch import watch_imports
from .lastwords import LastWords, write_json
from .liveness import liveness_loop
from .motion import Motion
from .patch_data import SHAPES_EVERY, batch_shapes, describe_batch, wrap_dataloader
from .stride import STRIDE_AFTER, STRIDE_EVERY, STRIDE_STEP_S, Stride

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:  # annotations only
    from typing import Any, Callable, Optional

_monotonic = time.monotonic
METRICS_KEPT = 256
EXIT_JOIN_S = 1.0  # seconds the exiting job waits at most for the liveness thread to end its tick


_MARKED = object()  # the step source of blackbox.step(): the job marks its steps itself


class Recorder(Stride):
    # The step path's state in slots: in a real step its code and data are cold, and a slot is one load at a fixed
    # offset of one small block (scripts/bench_overhead.py measures the step path in place).
    __slots__ = ("_hd", "_hooks_in", "_hq", "_last_dt", "_last_step_time", "_left", "_short",
                 "_slowest", "_stale", "_stepper", "_striding", "_unhooked_steps", "enabled", "hb",
                 "step_count")  # fmt: skip

    def __init__(self, run_dir: str, rank: int, local_rank: int, world_size: int, mode: str) -> None:
        self.pid = os.getpid()
        self.rank = rank
        self.mode = mode
        self.enabled = True
        self.rank_dir = os.path.join(run_dir, P.RANKS_DIR, str(rank))
        os.makedirs(self.rank_dir, mode=0o700, exist_ok=True)
        self._failed: set[str] = set()
        self.hb_path = os.path.join(self.rank_dir, P.RANK_HEARTBEAT)
        self.hb = HeartbeatWriter(
            self.hb_path,
            pid=self.pid,
            start_ticks=_own_start_ticks(),
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            mode=mode,
        )
        self.hb_ino = os.stat(self.hb_path).st_ino
        # the heartbeat's progress group is written by _on_step itself, in HeartbeatWriter.progress's layout (its
        # words and version): a call less a step, on the path that runs every step with its code and data cold
        self._hq, self._hd = self.hb._q, self.hb._d
        # step accounting
        self.step_count = 0
        self._last_step_time = self.hb.mono0
        self._slowest = 0.0
        self._raised = False  # an uncaught exception reached the main thread
        self._stepper = 0  # id of what counts the steps: the job's first optimizer, or _MARKED; 0 until known
        # phases: the current one, restored on exit of a nested one
        self._phase: tuple[int, float, bytes] = (P.PHASE_STARTUP, self.hb.mono0, b"")
        self._collective_op = 0  # the last collective entered, kept in every phase write
        self._collective_seq = 0
        self._last_dt = 0.0
        self._data_wait = 0.0
        self._batches = 0
        # metrics and annotations, written to files by the liveness thread, never on the step path
        self._metrics: list[dict[str, Any]] = []  # the most recent METRICS_KEPT entries
        self._annotations: dict[str, Any] = {}
        self._dirty = False
        self._lock = threading.Lock()
        self._liveness_interval = _float_env(P.ENV_LIVENESS_INTERVAL, 0.5)
        self._stop = threading.Event()
        self._liveness: Optional[threading.Thread] = None
        # what a dump or a last-words record says besides the stacks
        self._group_seq: dict[int, int] = {}  # per process group (id of the group object; 0 = default)
        # (path, shape, dtype) of a recent batch's tensors (each loader's first, then every SHAPES_EVERY-th one)
        self._last_batch: Any = None
        self._last_wait = 0.0
        self._loader: Any = None  # weak reference to the DataLoader iterator in use
        self._loader_written: Any = None
        self.seeds: dict[str, Any] = {}
        self.torch: Any = None
        self._threads_written: dict[str, str] = {}
        self._versions_written = False
        self.lastwords = LastWords(self)
        self.motion = Motion(self)  # progress that is not a step: the main thread's stack, forward calls
        # the stride (stride.py): hooks that may be taken out, as [owner, attribute, original, wrapper, phase]
        self._strided: list[list[Any]] = []
        self._stride_every = int(_float_env(P.ENV_STRIDE, STRIDE_EVERY))
        self._short = 0  # short steps in a row
        self._striding = False
        self._hooks_in = True
        self._left = 0  # steps left in the current sampled or unhooked stretch
        self._sample_from: list[float] = []  # ledger and batches at the sampled step's start
        self._sample_at = 0.0  # ... and its time
        self._unhooked_from: Optional[list[float]] = None  # ... and at the unhooked stretch's start
        self._unhooked_steps = 0
        self._shares: list[tuple[int, float]] = []  # (ledger slot, share of the base phase's time) from the sample
        self._base = P.ledger_slot(P.PHASE_COMPUTE)  # the phase the hidden data and backward time accrues to
        self._batches_per_step = 0.0
        self._sampled: list[float] = []  # the samples' ledger and batch deltas, a moving average (SAMPLE_KEEP)
        self._weight = 0.0  # ... and the number of samples in it, averaged alike
        self._stale = -1  # a phase the liveness thread set from the stack: left by the next step
        self.samples = 0  # samples so far (SAMPLE_STEPS steps each)

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        os.environ[P.ENV_RECORDER] = "%d:%s:%d" % (self.pid, self.mode, self.rank)
        self.guard("exit", lambda: atexit.register(self._on_exit))
        self.lastwords.install()
        self.guard("fork", lambda: os.register_at_fork(after_in_child=self._after_fork))
        self.guard("imports", watch_imports, {
            "torch": self._on_torch_imported,
            "numpy.random": lambda m: self.guard("seeds", self._wrap_seed, m, "numpy.random.seed"),
            "random": lambda m: self.guard("seeds", self._wrap_seed, m, "random.seed"),
            "torch.distributed.checkpoint": lambda m: self.guard("checkpoint", _wrap_dcp, self, m),
        })  # fmt: skip
        self._liveness = threading.Thread(target=liveness_loop, args=(self,), name="blackbox-liveness", daemon=True)
        self._liveness.start()

    def _after_fork(self) -> None:
        # A forked child (a DataLoader worker) shares the heartbeat mapping: it must never write to it.
        self.enabled = False
        self._stop.set()

    def _on_exit(self) -> None:
        if self.enabled and os.getpid() == self.pid:
            self._stop.set()
            # The liveness thread ends before the interpreter tears itself down: a daemon thread still importing
            # (its first ticks load the redactor) or reading frames then crashes the exiting job (SIGSEGV, one
            # short-lived rank in ten on a busy machine). A tick takes milliseconds; one stuck on a hung
            # filesystem is not waited for long.
            liveness = self._liveness
            if liveness is not None and liveness is not threading.current_thread():
                liveness.join(EXIT_JOIN_S)
            self.flush()
            if not self._raised:  # exit handlers run after an uncaught exception too: keep what it was
                self.hb.state(P.STATE_EXITED)

    def mark_exception(self) -> None:
        if self.enabled:
            self._raised = True
            self.hb.state(P.STATE_EXCEPTION)

    def context(self) -> dict[str, Any]:
        """What every record carries besides its own subject: where the rank was and with what data."""
        code, started, name = self._phase
        return {
            "step": self.step_count,
            "phase": name.decode("utf-8", "replace") if code == P.PHASE_CUSTOM else P.PHASE_NAMES.get(code, "?"),
            "phase_for_s": round(_monotonic() - started, 3),
            "last_collective": P.COLLECTIVE_OPS[self._collective_op],
            "last_batch": describe_batch(self._last_batch),
            "last_data_wait_s": round(self._last_wait, 6),
            "seeds": dict(self.seeds),
        }

    # --- guarded hooks ----------------------------------------------------------------------------
    def guard(self, hook: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            self.fail(hook, exc)
            return None

    def fail(self, hook: str, exc: BaseException) -> None:
        """Switch `hook` off and write why to the rank's log, once."""
        if hook in self._failed:
            return
        self._failed.add(hook)
        try:
            import traceback

            with open(os.path.join(self.rank_dir, P.RANK_LOG), "a") as f:
                f.write(
                    "%s blackbox recorder: hook %r failed and is switched off: %s\n%s\n"
                    % (
                        time.strftime("%Y-%m-%dT%H:%M:%S"),
                        hook,
                        exc,
                        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                    )
                )
        except Exception:
            pass

    def hook_ok(self, hook: str) -> bool:
        return self.enabled and hook not in self._failed

    # --- steps (the hot path: a few stores, no syscall) --------------------------------------------
    def step(self) -> None:
        """A step the job marks itself (blackbox.step()): from then on, optimizer steps are not counted."""
        if "optimizer_step" in self._failed:
            return
        self._stepper = id(_MARKED)
        self._on_step(_MARKED, None, None)

    def _on_step(self, source: Any, args: Any, kwargs: Any) -> None:
        """torch's optimizer step post hook, and blackbox.step(): one frame, run once a step (`source`: the
        optimizer, or _MARKED). Anything but the source that counts steps goes to _other_step."""
        if id(source) != self._stepper or not self.enabled:
            self._other_step(source)
            return
        try:
            now = _monotonic()
            dt = now - self._last_step_time
            self._last_step_time = now
            n = self.step_count + 1
            self.step_count = n
            self._last_dt = dt
            q, d = self._hq, self._hd  # the progress group (HeartbeatWriter.progress, inlined)
            v = q[8] + 1
            q[8] = v  # P.W_PROGRESS: the version at both ends, the step, its time, its length, the slowest
            q[9] = n
            d[10] = now
            d[11] = dt
            if dt > self._slowest and n > 1:  # the first step includes start-up: not a step time
                self._slowest = dt
                d[12] = dt  # (written when it changes: its word keeps it)
            q[13] = v
            if dt < STRIDE_STEP_S:
                self._short += 1
                if self._short >= STRIDE_AFTER:
                    if self._left > 1:  # within a stretch (no call: this runs on most short steps)
                        self._left -= 1
                        self._unhooked_steps += not self._hooks_in
                    else:
                        self._stride(now)
            elif self._striding:
                self._stride_stop(now)
            else:
                self._short = 0
            if self._stale >= 0:
                self._leave_stale(now)
            if n == 1:
                self.hb.state(P.STATE_RUNNING)
                if self._phase[0] == P.PHASE_STARTUP:
                    self._phase = (P.PHASE_COMPUTE, now, b"")
                    self.hb.phase(P.PHASE_COMPUTE, now, self._collective_op, self._collective_seq)
        except Exception as exc:  # the hook stays registered but counts nothing after a fault
            self._stepper = -1
            self.fail("optimizer_step", exc)

    def _other_step(self, source: Any) -> None:
        """A step hook call from anything but the source that counts steps: the job's first optimizer becomes it
        (several optimizers, as in a GAN, step once an iteration: the others are not counted)."""
        if self._stepper == 0 and self.enabled and source is not _MARKED and "optimizer_step" not in self._failed:
            self._stepper = id(source)
            self._on_step(source, None, None)

    def _drop_stale(self) -> tuple[int, float, bytes]:
        """A hook entered after a phase the liveness thread named: that call has ended; what it returns to is
        compute."""
        stale, self._stale = self._stale, -1
        previous = self._phase
        return (P.PHASE_COMPUTE, previous[1], b"") if previous[0] == stale else previous

    def _leave_stale(self, now: float) -> None:
        """A step after a phase the liveness thread named: that call has returned (no hook saw it end)."""
        stale, self._stale = self._stale, -1
        if self._phase[0] == stale:
            self._phase = (P.PHASE_COMPUTE, now, b"")
            self.hb.phase(P.PHASE_COMPUTE, now, self._collective_op, self._collective_seq)

    # --- phases -----------------------------------------------------------------------------------
    def enter_phase(self, code: int, name: bytes = b"") -> tuple[int, float, bytes]:
        previous = self._phase if self._stale < 0 else self._drop_stale()
        now = _monotonic()
        self._phase = (code, now, name)
        self.hb.phase(code, now, self._collective_op, self._collective_seq, name)
        return previous

    def exit_phase(self, previous: tuple[int, float, bytes], now: Optional[float] = None) -> None:
        code = previous[0]
        if code == P.PHASE_STARTUP and self.step_count:
            code = P.PHASE_COMPUTE
        if now is None:
            now = _monotonic()
        self._phase = (code, now, previous[2])
        self.hb.phase(code, now, self._collective_op, self._collective_seq, previous[2])

    def batch_delivered(self, previous: tuple[int, float, bytes], batch: Any, it: Any) -> None:
        """A DataLoader batch arrived: the rank is making progress even where no optimizer steps (eval).
        The wait is timed from the start of the `data` phase the caller entered."""
        now = _monotonic()
        self._last_wait = now - self._phase[1]
        self._data_wait += self._last_wait
        self._batches += 1
        loader = self._loader
        if loader is None or loader() is not it:
            import weakref

            self._loader = weakref.ref(it)
            self._last_batch = batch_shapes(batch)
        elif self._batches % SHAPES_EVERY == 0:  # shapes rarely change: a recent batch's will do
            self._last_batch = batch_shapes(batch)
        self.hb.data(self._data_wait, self._batches)
        self.hb.progress(self.step_count, now, self._last_dt, self._slowest)
        self.exit_phase(previous, now)

    def joining(self, code: int) -> None:
        """Where the rank is in joining its process group (protocol.W_JOIN); never from a forked child."""
        if self.enabled and os.getpid() == self.pid:
            self.hb.join(code)

    def counting(self, dist: Any) -> None:
        """The ring's count of the collectives issued on the default group (protocol's ring): torch's own getter,
        from the group `dist` has just joined; None, as the group is destroyed: no count. Never from a forked
        child."""
        if not self.enabled or os.getpid() != self.pid:
            return
        get = getattr(getattr(dist, "distributed_c10d", None), "_get_default_group", None) if dist else None
        issued = getattr(get(), "_get_sequence_number_for_group", None) if get is not None else None
        self.hb.issued = issued if issued is not None and isinstance(issued(), int) else None

    def enter_collective(self, op: int, group: Any) -> tuple[int, float, bytes]:
        previous = self._phase if self._stale < 0 else self._drop_stale()
        now = _monotonic()
        self._collective_op = op
        key = 0 if group is None else id(group)
        self._collective_seq = self._group_seq.get(key, 0) + 1
        self._group_seq[key] = self._collective_seq
        self._phase = (P.PHASE_COLLECTIVE, now, b"")
        self.hb.phase(P.PHASE_COLLECTIVE, now, op, self._collective_seq)
        return previous

    # --- annotations and metrics (kept in memory, written by the liveness thread) ------------------
    def annotate(self, fields: dict[str, Any]) -> None:
        with self._lock:
            self._annotations.update({str(k): _jsonable(v) for k, v in fields.items()})
            self._dirty = True

    def log_metrics(self, step: Optional[int], metrics: dict[str, Any]) -> None:
        entry: dict[str, Any] = {"time": time.time(), "step": step}
        entry.update({str(k): _jsonable(v) for k, v in metrics.items()})
        with self._lock:
            self._metrics.append(entry)
            if len(self._metrics) > METRICS_KEPT:
                del self._metrics[0]
            self._dirty = True

    def flush(self) -> None:
        """Annotations and metrics to their files, when they changed (the liveness thread, and at exit)."""
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            annotations = dict(self._annotations)
            metrics = list(self._metrics)
        if annotations:
            write_json(os.path.join(self.rank_dir, P.RANK_ANNOTATIONS), annotations)
        if metrics:
            write_json(os.path.join(self.rank_dir, P.RANK_METRICS), metrics)

    # --- torch ------------------------------------------------------------------------------------
    def _on_torch_imported(self, torch: Any) -> None:
        # the rooms of torch's patches are read now, not at every interpreter start of the job
        from .patch_backward import wrap_backward
        from .patch_checkpoint import wrap_checkpoint
        from .patch_collectives import wrap_collectives
        from .torch_setup import flight_recorder_env, record_memory_history_at_cuda_init

        self.torch = torch
        self.guard("optimizer_step", self._install_optimizer_hook, torch)
        self.guard("collectives", wrap_collectives, self, torch)
        self.guard("data", wrap_dataloader, self)
        self.guard("checkpoint", wrap_checkpoint, self, torch)
        self.guard("backward", wrap_backward, self, torch)
        self.guard("forwards", self.motion.watch_compile, torch)
        self.guard("oom", self.lastwords.watch_oom, torch)
        self.guard("seeds", self._wrap_seed, torch, "torch.manual_seed", "manual_seed")
        cuda = getattr(torch, "cuda", None)
        for name in ("manual_seed", "manual_seed_all"):
            self.guard("seeds", self._wrap_seed, cuda, "torch.cuda." + name, name)
        self.guard("flight_recorder", flight_recorder_env, torch)
        history = os.environ.get(P.ENV_CUDA_MEMORY_HISTORY)
        if history:
            self.guard("memory_history", record_memory_history_at_cuda_init, torch, int(history))

    def _wrap_seed(self, module: Any, label: str, attr: str = "seed") -> None:
        """Record the seed values the job sets; the call itself is unchanged."""
        import functools

        fn = getattr(module, attr, None) if module is not None else None
        if fn is None or getattr(fn, "__blackbox_wrapped__", False):
            return
        seeds = self.seeds

        @functools.wraps(fn)
        def seeded(*args: Any, **kwargs: Any) -> Any:
            try:
                value = args[0] if args else kwargs.get("seed", kwargs.get("a"))
                seeds[label] = value if isinstance(value, (int, float, str, type(None))) else repr(value)[:100]
            except Exception:
                pass
            return fn(*args, **kwargs)

        seeded.__blackbox_wrapped__ = True  # type: ignore[attr-defined]
        setattr(module, attr, seeded)

    def _install_optimizer_hook(self, torch: Any) -> None:
        import importlib

        module = importlib.import_module("torch.optim.optimizer")  # imported by `import torch` already
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is None:
            raise RuntimeError("this torch has no register_optimizer_step_post_hook: steps need blackbox.step()")
        register(self._on_step)


# --- torch integration ------------------------------------------------------------------------------
def _wrap_dcp(rec: Recorder, dcp: Any) -> None:
    from .patch_checkpoint import wrap_dcp

    wrap_dcp(rec, dcp)


# --- helpers ----------------------------------------------------------------------------------------
def _own_start_ticks() -> int:
    try:
        with open("/proc/self/stat") as f:
            return P.parse_proc_stat(f.read())[2]
    except (OSError, ValueError, IndexError):
        return 0


def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    item = getattr(value, "item", None)  # a 0-d tensor or numpy scalar
    if callable(item):
        try:
            return _jsonable(item())
        except Exception:
            pass
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value[:64]]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in list(value.items())[:64]}
    return repr(value)[:200]


# --- activation ---------------------------------------------------------------------------------------
ACTIVE: Optional[Recorder] = None


def activate(run_dir: str, rank: int, local_rank: int, world_size: int, mode: str) -> Optional[Recorder]:
    """Start recording in this process (called once by the injected sitecustomize)."""
    global ACTIVE
    if ACTIVE is not None and ACTIVE.pid == os.getpid():
        return ACTIVE
    if mode == P.MODE_SINGLE and not _claim_single(run_dir):
        return None
    rec = Recorder(run_dir, rank, local_rank, world_size, mode)
    rec.start()
    ACTIVE = rec
    return rec


def defer(run_dir: str) -> None:
    """A process started by a single-process recorder (torch.multiprocessing.spawn and the like) that sets its
    rank in code: record it as that rank once it has joined the process group. Until then, and if it never
    does (a helper, a compile worker), it costs one import watcher."""

    parent = os.environ.get(P.ENV_RECORDER, "")

    def wrap(dist: Any) -> None:
        original = getattr(dist, "init_process_group", None)
        if original is None or getattr(original, "_blackbox", False):
            return

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            try:
                rank, world = dist.get_rank(), dist.get_world_size()
                local = int(os.environ.get("LOCAL_RANK", rank))
                rec = activate(run_dir, rank, local, world, P.MODE_RANK)
                if rec is not None:
                    rec.joining(P.JOIN_JOINED)  # recorded from here on: it has joined
                    retire_parent(run_dir, parent, rank)
            except Exception:
                pass  # never the job's problem
            return result

        init_process_group._blackbox = True  # type: ignore[attr-defined]
        init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
        dist.init_process_group = init_process_group

    watch_imports({"torch.distributed": wrap})


def retire_parent(run_dir: str, parent: str, rank: int) -> None:
    """The Slurm task that started this rank (torch.multiprocessing.spawn in one task per node) recorded as rank
    SLURM_PROCID until now: it is their launcher, not that rank. Its heartbeat goes (its recorder sees that and
    steps aside); a rank of the same number has replaced it already."""
    pid, _, rest = parent.partition(":")
    mode, _, parent_rank = rest.partition(":")
    if mode != P.MODE_SLURM or not parent_rank.isdigit() or int(parent_rank) == rank:
        return
    path = os.path.join(run_dir, P.RANKS_DIR, parent_rank, P.RANK_HEARTBEAT)
    try:
        with open(path, "rb") as f:
            head = f.read(P.OFF_IDENT + 8)
        if len(head) == P.OFF_IDENT + 8 and str(int.from_bytes(head[P.OFF_IDENT :], "little", signed=True)) == pid:
            os.unlink(path)
    except OSError:
        pass


def _claim_single(run_dir: str) -> bool:
    """A process without RANK records as rank 0 only if no live process holds that claim already
    (a wrapper script may run several Python processes in turn)."""
    rank_dir = os.path.join(run_dir, P.RANKS_DIR, "0")
    os.makedirs(rank_dir, mode=0o700, exist_ok=True)
    claim = os.path.join(rank_dir, P.RANK_SINGLE_CLAIM)
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                with open(claim) as f:
                    holder = int(f.read().strip() or 0)
            except (OSError, ValueError):
                holder = 0
            if holder and holder != os.getpid() and os.path.exists("/proc/%d" % holder):
                return False
            try:
                os.unlink(claim)
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False
