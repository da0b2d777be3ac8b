"""`blackbox collect` on a job started with `blackbox run`: the job's own supervisor is asked to collect ("collect
now", SIGUSR1; with `--preemption`, a request file says it is the pod's preStop hook) instead of reading the ranks
from outside. Both sides of that request live here. Imports the stdlib, blackbox's /proc adapter, the protocol's
names, the detections' trigger names and the run directory's safe reader."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from typing import Optional

from .._recorder import protocol as P
from ..adapters import procfs
from ..detections import Trigger
from ..safeopen import RunDir, as_user
from .job import Job, ancestors, is_blackbox

POLL_S = 0.2  # how often the run's bundles directory is looked at while the supervisor collects
MANUAL, PREEMPTION = "manual", "preemption"  # what a collection is asked as
TRIGGERS = {MANUAL: Trigger("manual"), PREEMPTION: Trigger("signal", "prestop")}  # the bundle each one writes
REQUEST_MAX_AGE_S = 10.0  # a request file older than this when SIGUSR1 comes is not the signal's (its asker gone)


@dataclass(frozen=True)
class Supervisor:
    pid: int
    start_ticks: int


def supervisor_of(job: Job) -> Optional[Supervisor]:
    """The `blackbox run` above the job's ranks — their ancestor; PID 1 in a container it started — when the ranks
    run its recorder (the job has a run directory); None for a job started without it."""
    if not job.run_dir or not job.ranks:
        return None
    for pid in ancestors(job.ranks[0].pid, through_init=True):
        if is_blackbox(procfs.cmdline(pid), "run"):
            st = procfs.proc_stat(pid)
            return Supervisor(pid, st.start_ticks) if st is not None else None
    return None


def ask(job: Job, sup: Supervisor, budget: float, kind: str = MANUAL) -> tuple[Optional[str], str]:
    """Send "collect now" (SIGUSR1) to the job's supervisor — as `kind`: a preemption's is said first in the run's
    request file — and wait, up to `budget` seconds, for the bundle it writes into the run's bundles directory
    (written whole, then renamed into place): (its name, ""), or (None, why not). Only a new bundle of that kind
    counts, the job's user's own regular file (the run directory is read as untrusted: no link is followed)."""
    assert job.run_dir is not None
    run = RunDir(job.run_dir, job.owner)
    before = set(run.list(P.BUNDLES_DIR))
    suffix = f"-{TRIGGERS[kind].name}.tar.gz"
    try:
        if not procfs.is_alive(sup.pid, sup.start_ticks):
            return None, "it has ended"
        if kind != MANUAL:
            _write_request(job, kind)
        os.kill(sup.pid, signal.SIGUSR1)  # (PID 1 in a container: found above the ranks, a `blackbox run`)
    except OSError as exc:
        return None, f"it cannot be asked from here ({exc.strerror}: another user's process or run directory)"
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        for name in sorted(set(run.list(P.BUNDLES_DIR)) - before):
            if name.endswith(suffix) and not name.startswith(".") and run.size(_rel(name)) is not None:
                return name, ""
    if kind != MANUAL:  # given up: a signal it takes later is a plain "collect now", not this request
        with as_user(job.owner):
            _remove_request(job.run_dir)
    return None, f"it wrote no bundle within {budget:g} s (busy with another collection, or stuck)"


def _write_request(job: Job, kind: str) -> None:
    """The run's request file, written as the job's user (root writes it with their uid: the supervisor takes only
    its own user's), replaced whole."""
    assert job.run_dir is not None
    path = os.path.join(job.run_dir, P.COLLECT_REQUEST)
    with as_user(job.owner):
        _remove_request(job.run_dir)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"kind": kind, "pid": os.getpid()}, f)


def take_request(run_dir: str) -> str:
    """What the SIGUSR1 just received asks for (the supervisor's side): the request file's kind when it is this
    user's own regular file, written within REQUEST_MAX_AGE_S, and names a known kind; else a plain "collect now"
    (MANUAL). The file is removed once read: each request is answered once."""
    try:
        fd = RunDir(run_dir, os.geteuid()).open_fd(P.COLLECT_REQUEST)
    except OSError:  # none (a plain SIGUSR1), or refused: a link, another user's
        fd = -1
    try:
        if fd < 0:
            return MANUAL
        fresh = time.time() - os.fstat(fd).st_mtime <= REQUEST_MAX_AGE_S
        kind = json.loads(os.read(fd, 4096)).get("kind")
        return kind if fresh and kind in TRIGGERS else MANUAL
    except (OSError, ValueError, AttributeError):
        return MANUAL
    finally:
        if fd >= 0:
            os.close(fd)
        _remove_request(run_dir)


def _remove_request(run_dir: str) -> None:
    """The request file gone (the name only: a link's target is never touched), if it is there."""
    try:
        os.unlink(os.path.join(run_dir, P.COLLECT_REQUEST))
    except OSError:
        pass


def copy(job: Job, name: str, dest: str) -> str:
    """A bundle of the run copied to `dest` (read through the run directory's safe reader: no link followed),
    private to this user; `dest`."""
    assert job.run_dir is not None
    fd = RunDir(job.run_dir, job.owner).open_fd(_rel(name))
    with os.fdopen(fd, "rb") as src, open(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as dst:
        shutil.copyfileobj(src, dst)
    return dest


def bundle_path(job: Job, name: str) -> str:
    assert job.run_dir is not None
    return os.path.join(job.run_dir, P.BUNDLES_DIR, name)


def _rel(name: str) -> str:
    return f"{P.BUNDLES_DIR}/{name}"
