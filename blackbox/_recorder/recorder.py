"""The rank recorder: keeps this rank's heartbeat, counts steps and phases with zero code change, and never
hurts the job (every hook guarded: a failure is logged once to the rank's log and switches that hook off).
Stdlib only, Python >= 3.9; torch is touched only after the job itself imports it."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

from . import protocol as P
from .heartbeat import HeartbeatWriter

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:  # annotations only
    from typing import Any, Callable, Optional

_monotonic = time.monotonic
METRICS_KEPT = 256


class Recorder:
    def __init__(self, run_dir: str, rank: int, local_rank: int, world_size: int, mode: str) -> None:
        self.pid = os.getpid()
        self.rank = rank
        self.mode = mode
        self.enabled = True
        self.rank_dir = os.path.join(run_dir, "ranks", str(rank))
        os.makedirs(self.rank_dir, mode=0o700, exist_ok=True)
        self._failed: set[str] = set()
        self.hb = HeartbeatWriter(
            os.path.join(self.rank_dir, "heartbeat"),
            pid=self.pid,
            start_ticks=_own_start_ticks(),
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            mode=mode,
        )
        # step accounting
        self.step_count = 0
        self._last_step_time = self.hb.mono0
        self._slowest = 0.0
        self._explicit_steps = False
        self._primary_optimizer: Optional[int] = None
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

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        os.environ[P.ENV_RECORDER] = "%d:%s" % (self.pid, self.mode)
        self._guard("exit", lambda: atexit.register(self._on_exit))
        self._guard("excepthook", self._install_excepthook)
        self._guard("fork", lambda: os.register_at_fork(after_in_child=self._after_fork))
        self._guard("torch", _watch_torch_import, self._on_torch_imported)
        t = threading.Thread(target=self._liveness_loop, name="blackbox-liveness", daemon=True)
        t.start()

    def _after_fork(self) -> None:
        # A forked child (a DataLoader worker) shares the heartbeat mapping: it must never write to it.
        self.enabled = False
        self._stop.set()

    def _on_exit(self) -> None:
        if self.enabled and os.getpid() == self.pid:
            self._stop.set()
            self._flush()
            self.hb.state(P.STATE_EXITED)

    def _install_excepthook(self) -> None:
        previous = sys.excepthook

        def excepthook(tp: Any, value: Any, tb: Any) -> None:
            try:
                if self.enabled:
                    self.hb.state(P.STATE_EXCEPTION)
            except Exception:  # never let the recorder change what the job prints
                pass
            previous(tp, value, tb)

        sys.excepthook = excepthook

    # --- guarded hooks ----------------------------------------------------------------------------
    def _guard(self, hook: str, fn: Callable[..., Any], *args: Any) -> Any:
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

            with open(os.path.join(self.rank_dir, "recorder.log"), "a") as f:
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
    def step(self, explicit: bool = False) -> None:
        if not self.enabled:
            return
        if explicit:
            self._explicit_steps = True
        now = _monotonic()
        dt = now - self._last_step_time
        self._last_step_time = now
        n = self.step_count + 1
        self.step_count = n
        if n > 1 and dt > self._slowest:  # the first step includes start-up: not a step time
            self._slowest = dt
        self._last_dt = dt
        self.hb.progress(n, now, dt, self._slowest)
        if n == 1:
            self.hb.state(P.STATE_RUNNING)
            if self._phase[0] == P.PHASE_STARTUP:
                self._phase = (P.PHASE_COMPUTE, now, b"")
                self.hb.phase(P.PHASE_COMPUTE, now, self._collective_op, self._collective_seq)

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self._explicit_steps or not self.enabled or "optimizer_step" in self._failed:
                return
            key = id(optimizer)
            if self._primary_optimizer is None:
                self._primary_optimizer = key
            if key == self._primary_optimizer:  # several optimizers (GANs) step once per iteration
                self.step()
        except Exception as exc:  # the hook stays registered but does nothing after a fault
            self.fail("optimizer_step", exc)

    # --- phases -----------------------------------------------------------------------------------
    def enter_phase(self, code: int, name: bytes = b"") -> tuple[int, float, bytes]:
        previous = self._phase
        now = _monotonic()
        self._phase = (code, now, name)
        self.hb.phase(code, now, self._collective_op, self._collective_seq, name)
        return previous

    def exit_phase(self, previous: tuple[int, float, bytes]) -> None:
        code = previous[0]
        if code == P.PHASE_STARTUP and self.step_count:
            code = P.PHASE_COMPUTE
        now = _monotonic()
        self._phase = (code, now, previous[2])
        self.hb.phase(code, now, self._collective_op, self._collective_seq, previous[2])

    def batch_delivered(self, previous: tuple[int, float, bytes], started: float) -> None:
        """A DataLoader batch arrived: the rank is making progress even where no optimizer steps (eval)."""
        now = _monotonic()
        self._data_wait += now - started
        self._batches += 1
        self.hb.data(self._data_wait, self._batches)
        self.hb.progress(self.step_count, now, self._last_dt, self._slowest)
        self.exit_phase(previous)

    def enter_collective(self, op: int) -> tuple[int, float, bytes]:
        previous = self._phase
        now = _monotonic()
        self._collective_op = op
        self._collective_seq += 1
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

    def _flush(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            annotations = dict(self._annotations)
            metrics = list(self._metrics)
        if annotations:
            _write_json_atomic(os.path.join(self.rank_dir, "annotations.json"), annotations)
        if metrics:
            _write_json_atomic(os.path.join(self.rank_dir, "metrics.json"), metrics)

    # --- the daemon thread --------------------------------------------------------------------------
    def _liveness_loop(self) -> None:
        counter = 0
        while not self._stop.is_set():
            try:
                if not self.enabled:
                    return
                counter += 1
                self.hb.liveness(counter, _monotonic())
                if "flush" not in self._failed:
                    try:
                        self._flush()
                    except Exception as exc:
                        self.fail("flush", exc)
            except Exception as exc:
                self.fail("liveness", exc)
                return
            self._stop.wait(self._liveness_interval)

    # --- torch ------------------------------------------------------------------------------------
    def _on_torch_imported(self, torch: Any) -> None:
        self._guard("optimizer_step", self._install_optimizer_hook, torch)
        self._guard("collectives", _wrap_collectives, self, torch)
        self._guard("data", _wrap_dataloader, self)
        self._guard("checkpoint", _wrap_checkpoint, self, torch)

    def _install_optimizer_hook(self, torch: Any) -> None:
        import importlib

        module = importlib.import_module("torch.optim.optimizer")  # imported by `import torch` already
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is None:
            raise RuntimeError("this torch has no register_optimizer_step_post_hook: steps need blackbox.step()")
        register(self._on_optimizer_step)


# --- torch integration ------------------------------------------------------------------------------
def _watch_torch_import(callback: Callable[[Any], None]) -> None:
    """Call `callback(torch)` right after the job imports torch; never import it ourselves."""
    if "torch" in sys.modules:
        callback(sys.modules["torch"])
        return
    sys.meta_path.insert(0, _TorchImportWatcher(callback))


class _TorchImportWatcher:
    def __init__(self, callback: Callable[[Any], None]) -> None:
        self.callback = callback

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec
        callback = self.callback

        def exec_and_notify(module: Any) -> None:
            exec_module(module)
            try:
                callback(module)
            except Exception:
                pass  # the callback guards its own hooks; nothing may reach the job's import

        try:
            loader.exec_module = exec_and_notify
        except Exception:
            return spec
        return spec


def _wrap_collectives(rec: Recorder, torch: Any) -> None:
    import functools

    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return
    compiler = getattr(torch, "compiler", None)
    is_compiling: Callable[[], bool] = getattr(compiler, "is_compiling", None) or (lambda: False)

    def wrap(fn: Callable[..., Any], op: int) -> Callable[..., Any]:
        @functools.wraps(fn)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if not rec.enabled or "collectives" in rec._failed or is_compiling():
                return fn(*args, **kwargs)
            try:
                previous = rec.enter_collective(op)
            except Exception as exc:
                rec.fail("collectives", exc)
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                try:
                    rec.exit_phase(previous)
                except Exception as exc:
                    rec.fail("collectives", exc)

        collective.__blackbox_wrapped__ = True  # type: ignore[attr-defined]
        return collective

    for op, name in enumerate(P.COLLECTIVE_OPS):
        fn = getattr(dist, name, None) if op else None
        if fn is None or getattr(fn, "__blackbox_wrapped__", False):
            continue
        setattr(dist, name, wrap(fn, op))


def _phase_wrapper(rec: Recorder, hook: str, code: int, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with the rank's phase set to `code` while it runs; the job's own errors pass through untouched."""
    import functools

    @functools.wraps(fn)
    def in_phase(*args: Any, **kwargs: Any) -> Any:
        if not rec.enabled or hook in rec._failed:
            return fn(*args, **kwargs)
        try:
            previous = rec.enter_phase(code)
        except Exception as exc:
            rec.fail(hook, exc)
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            try:
                rec.exit_phase(previous)
            except Exception as exc:
                rec.fail(hook, exc)

    in_phase.__blackbox_wrapped__ = True  # type: ignore[attr-defined]
    return in_phase


def _wrap_checkpoint(rec: Recorder, torch: Any) -> None:
    for name in ("save", "load"):
        fn = getattr(torch, name, None)
        if fn is not None and not getattr(fn, "__blackbox_wrapped__", False):
            setattr(torch, name, _phase_wrapper(rec, "checkpoint", P.PHASE_CHECKPOINT, fn))


def _wrap_dataloader(rec: Recorder) -> None:
    """Phase `data` while the job waits in DataLoader `__next__` (the iterator class, not the user's loader)."""
    import functools
    import importlib

    cls = importlib.import_module("torch.utils.data.dataloader")._BaseDataLoaderIter
    original = cls.__next__
    if getattr(original, "__blackbox_wrapped__", False):
        return

    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        if not rec.enabled or "data" in rec._failed:
            return original(self)
        try:
            previous = rec.enter_phase(P.PHASE_DATA)
            started = _monotonic()
        except Exception as exc:
            rec.fail("data", exc)
            return original(self)
        try:
            batch = original(self)
        except BaseException:
            try:
                rec.exit_phase(previous)
            except Exception as exc:
                rec.fail("data", exc)
            raise
        try:
            rec.batch_delivered(previous, started)
        except Exception as exc:
            rec.fail("data", exc)
        return batch

    __next__.__blackbox_wrapped__ = True  # type: ignore[attr-defined]
    cls.__next__ = __next__


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


def _write_json_atomic(path: str, data: Any) -> None:
    import json

    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


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


def _claim_single(run_dir: str) -> bool:
    """A process without RANK records as rank 0 only if no live process holds that claim already
    (a wrapper script may run several Python processes in turn)."""
    rank_dir = os.path.join(run_dir, "ranks", "0")
    os.makedirs(rank_dir, mode=0o700, exist_ok=True)
    claim = os.path.join(rank_dir, "single.pid")
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
