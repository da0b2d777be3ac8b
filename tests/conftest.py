"""Shared fixtures: the test process is a child subreaper, so every process a test starts (and every
orphan of it) ends up as our descendant and is killed and reaped after the test, whatever happened."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
UNIT = Path(__file__).resolve().parent / "unit"
INTEGRATION = Path(__file__).resolve().parent / "integration"
BIN = Path(sys.executable).parent
BLACKBOX = [sys.executable, "-m", "blackbox"]
TORCHRUN = str(BIN / "torchrun")
SCRATCH = ""  # the session's scratch directory (pytest_configure)


def pytest_configure(config: pytest.Config) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    # one scratch directory for the session, removed at its end: the temporary files of every process the tests
    # start (a scenario's work directory, torchrun's own) go under it, never left in /tmp by a job that was killed
    global SCRATCH
    SCRATCH = tempfile.mkdtemp(prefix="bb-tests-")
    os.chmod(SCRATCH, 0o1777)  # like /tmp: a job's process that drops root (read-failure's loader) still uses it
    os.environ["TMPDIR"] = SCRATCH
    # every blackbox the tests start indexes its bundles here, never in the user's ~/.local/share/blackbox
    os.environ["BLACKBOX_HOME"] = tempfile.mkdtemp(prefix="bb-home-", dir=SCRATCH)


def pytest_unconfigure(config: pytest.Config) -> None:
    if SCRATCH:
        shutil.rmtree(SCRATCH, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # the gallery rows' groups before pytest-xdist names each grouped test by its group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    global UNIT_ONLY
    UNIT_ONLY = bool(items) and all(UNIT in Path(str(item.fspath)).parents for item in items)
    for item in items:  # every integration test spawns real processes: `-m "not slow"` is the unit suite
        if INTEGRATION in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)
        if "gallery" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(f"gallery-{_gallery_row(item)}"))
    items.sort(key=lambda item: "long" not in item.keywords)  # the long tests first: none of them ends the session
    alone = [item for item in items if "alone" in item.keywords]
    if in_xdist_worker() and len(alone) < len(items):  # beside other tests' jobs these fail (memory, host limits)
        skip = pytest.mark.skip(reason="needs the machine to itself: run it in a session of its own (`make test` "
                                "does: `pytest -m alone` after the others)")  # fmt: skip
        for item in alone:
            item.add_marker(skip)
    gpu = [item for item in items if "gpu" in item.keywords]
    if gpu and not _has_cuda():  # torch is imported only when a gpu test is to run: the unit suite never does
        skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
        for item in gpu:
            item.add_marker(skip)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test whose xdist group does not hold fails before its fixtures, never runs a shared job twice: pytest-xdist
    marks a grouped test by its node id, and where pytest keeps the id elsewhere (pytest 9.2 with xdist 3.8) each
    worker that drew one of a group's tests ran the group's Slurm cluster, S3 server or gallery row side by side."""
    if in_xdist_worker() and item.config.getvalue("loadgroup") and "@" not in item.nodeid and (
            item.get_closest_marker("xdist_group") is not None):  # fmt: skip
        pytest.fail("--dist loadgroup did not group this test under this pytest and pytest-xdist: install the "
                    "versions pyproject.toml pins (`make setup`)", pytrace=False)  # fmt: skip


def _gallery_row(item: pytest.Item) -> str:
    """The gallery job a test reads (`@pytest.mark.gallery(NAME)`, or its `name` or `scenario` parameter, and its
    `mode` parameter: `run` or `collect`): the tests of one job run in one xdist worker, so that it runs once for all
    of them."""
    marker = item.get_closest_marker("gallery")
    params = getattr(getattr(item, "callspec", None), "params", {})
    name = marker.args[0] if marker is not None else params.get("name", params.get("scenario"))
    if not isinstance(name, str):
        raise pytest.UsageError(f"{item.nodeid} uses the gallery: say which scenario with @pytest.mark.gallery(NAME)")
    return name if params.get("mode", "run") == "run" else f"{name}-{params['mode']}"


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


UNIT_ONLY = False  # the session runs unit tests only (collected in this process): none of them may import torch


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """The unit suite is pure: in a session of unit tests only, the test after which torch is imported fails (`make
    test-fast` stays fast, and a unit test that needs torch belongs in tests/integration). Said in the test's own
    report, so that it reaches the terminal from an xdist worker too."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    global UNIT_ONLY
    if call.when == "teardown" and UNIT_ONLY and "torch" in sys.modules:
        UNIT_ONLY = False  # said once: the tests after it are not to blame
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} imported torch: move the test that needs it to tests/integration"


# pids of the servers a module shares between its tests (tests/integration/services.py): their fixtures stop them
SERVICES: set[int] = set()


def _reap_descendants() -> None:
    """Kill and reap every process the test left, except a gallery job still running beside the tests and the
    module's shared servers."""
    me = psutil.Process()
    runner = sys.modules.get("runner")
    with getattr(runner, "LIVE_LOCK", contextlib.nullcontext()):
        keep: set[int] = set(getattr(runner, "LIVE", ())) | SERVICES
        procs = []
        for p in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if p.pid in keep or any(a.pid in keep for a in p.parents()):
                    continue
                procs.append(p)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=5)
    if keep:  # a gallery job's own Popen must reap it (its exit code is the test's): reap only what was killed
        for p in procs:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(p.pid, os.WNOHANG)
        return
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


@pytest.fixture(autouse=True)
def reap_everything() -> Iterator[None]:
    yield
    _reap_descendants()


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> object:
    """Poll a condition (a file appearing, a process state) until it holds; never a bare sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOX_") or k == "BLACKBOX_HOME"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def start_blackbox(args: list[str], cwd: Path, **extra_env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*BLACKBOX, *args], cwd=cwd, env=job_env(**extra_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def run_blackbox(
    args: list[str], cwd: Path, timeout: float = 120, **extra_env: str
) -> subprocess.CompletedProcess[bytes]:
    proc = start_blackbox(args, cwd, **extra_env)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def bundles(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "bundles").glob("*.tar.gz"))


# Tables printed at the end of the session (pytest_terminal_summary): a test adds its row with `table_row`, carried in
# its report, so that the rows of tests run by pytest-xdist's workers reach the one terminal too.
TABLES: dict[str, list[Any]] = {}
GALLERY_JOBS = 2  # gallery runs at a time, when pytest runs the tests one after another (no xdist workers)


def table_row(request: pytest.FixtureRequest, table: str, row: Any) -> None:
    """Add `row` (plain data: strings, numbers, lists, dicts) to the end-of-session table `table`."""
    request.node.user_properties.append((f"table:{table}", row))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, row in report.user_properties if report.when == "call" else ():
        if isinstance(key, str) and key.startswith("table:"):
            TABLES.setdefault(key[len("table:") :], []).append(row)


def in_xdist_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


@pytest.fixture(scope="session")
def gallery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., tuple[Path, Any]]]:
    """Runs a scenario of the gallery (scripts/scenarios/) once per test session, under `blackbox run` (mode
    "run") or under plain torchrun collected by `blackbox collect` (mode "collect"); the verdict tests and the
    last-words tests read the same run: (run directory or bundle directory, runner.Outcome)."""
    sys.path.insert(0, str(ROOT / "scripts" / "scenarios"))
    import runner

    done: dict[tuple[str, str], Future[tuple[Path, Any]]] = {}
    pool = ThreadPoolExecutor(max_workers=GALLERY_JOBS, thread_name_prefix="gallery")
    order = [(n, "run") for n in runner.SCENARIOS] + [(n, "collect") for n, s in runner.SCENARIOS.items()
                                                       if s.get("collect")]  # fmt: skip

    def one(name: str, mode: str) -> tuple[Path, Any]:
        base = tmp_path_factory.mktemp(f"gallery-{name}-{mode}")
        if mode == "run":
            return base / "run", runner.run(name, base / "run", base)
        return base / "out", runner.collect(name, base / "out", base)

    def run(name: str, mode: str = "run") -> tuple[Path, Any]:
        # the next row of the gallery starts beside this one: two jobs at a time halve the gallery's wall time,
        # and no job's timing is tight enough to mind sharing the two cores (under xdist its workers run the rows
        # side by side: each row's tests are one group, conftest.pytest_collection_modifyitems)
        ahead = [key for key in order if key not in done and key != (name, mode)][: GALLERY_JOBS - 1]
        ahead = [] if in_xdist_worker() else ahead
        wanted = [(name, mode), *ahead]
        for key in wanted:
            if key not in done:
                done[key] = pool.submit(one, *key)
        return done[name, mode].result()

    yield run
    # a job started ahead for a test that did not come (a part of the suite): ended now, not run to its end
    for future in done.values():
        future.cancel()
    while not all(future.done() for future in done.values()):
        with runner.LIVE_LOCK:
            live = list(runner.LIVE)
        for pid in live:
            runner.kill_tree(pid)
        wait(done.values(), timeout=1.0)
    pool.shutdown()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    rows = TABLES.get("gallery")
    if rows:
        sys.path.insert(0, str(ROOT / "scripts" / "scenarios"))
        import runner

        terminalreporter.write_sep("-", "scenario gallery: expected and got verdicts")
        terminalreporter.write_line(runner.table(sorted((tuple(r) for r in rows), key=lambda r: (r[0], r[1]))))
    rows = TABLES.get("gpu corpus")
    if rows:
        from tests.unit.test_gpu_corpus import corpus_table

        terminalreporter.write_sep("-", "GPU corpus: the thread's answer and blackbox's")
        terminalreporter.write_line(corpus_table(sorted(tuple(r) for r in rows)))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL `proc` and every process under it, then reap it and read what is left of its pipes. Killing
    `blackbox run` alone is not enough: the job outlives it by design, and its tee holds the output pipes open."""
    with contextlib.suppress(psutil.Error):
        tree = psutil.Process(proc.pid).children(recursive=True)
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
    proc.kill()
    proc.communicate()


def send(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
