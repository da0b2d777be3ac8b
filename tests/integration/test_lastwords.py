"""What each rank leaves in ranks/<rank>/ on its own, whatever happens to it, with no change to the job:
real torchrun, real gloo, real signals. Where a gallery scenario is the failure wanted, its run is shared with
the verdict tests (test_scenarios.py)."""

from __future__ import annotations

import json
import mmap
import os
import re
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Callable

import pytest

from blackbox.adapters import flight_recorder as fr
from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle
from blackbox.heartbeat_reader import HeartbeatState, decode
from tests.conftest import BLACKBOX, ROOT, TORCHRUN, bundles, job_env, kill_tree, run_blackbox, start_blackbox, wait_for

JOB = str(ROOT / "scripts" / "scenarios" / "train.py")
Gallery = Callable[[str], tuple[Path, Any]]  # the session's gallery runs (conftest.gallery)


def run_scenario(
    tmp_path: Path, scenario: str, rank: int, *extra: str, env: dict[str, str] | None = None
) -> tuple[Path, subprocess.CompletedProcess[bytes]]:
    run_dir = tmp_path / "run"
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--stall-timeout", "3", "--poll-interval", "0.5",
                        "--kill-grace", "5", *extra, "--", TORCHRUN, "--standalone", "--nproc-per-node", "2", JOB,
                        scenario, str(rank)], tmp_path, timeout=150, **(env or {}))  # fmt: skip
    return run_dir, res


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def latest_pydump(run_dir: Path, rank: int) -> dict[str, Any]:
    dumps = sorted((run_dir / "ranks" / str(rank)).glob("pydump-*.json"))
    assert dumps, f"rank {rank} wrote no dump"
    return json.loads(dumps[-1].read_text())


def read_heartbeat(run_dir: Path, rank: int) -> HeartbeatState:
    with open(run_dir / "ranks" / str(rank) / "heartbeat", "rb") as f:
        return decode(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def main_thread(dump: dict[str, Any]) -> list[dict[str, Any]]:
    return next(t["stack"] for t in dump["threads"] if t["name"] == "MainThread")


def bundle_names(run_dir: Path) -> list[str]:
    """The bundle's members as a reader sees them (the rank table's records as ranks/<r>/<name>)."""
    (bundle,) = bundles(run_dir)
    return sorted(read_bundle(str(bundle)).files)


@pytest.mark.parametrize("scenario", ["data-hang", "ddp-data-hang-workers"])  # the gallery's row: `scenario`
def test_data_hang(gallery: Gallery, scenario: str) -> None:
    run_dir, res = gallery(scenario)
    assert res.exit_code == 86, res.stderr
    dump = latest_pydump(run_dir, 1)
    assert dump["context"]["phase"] == "data" and dump["context"]["step"] == 3  # batch 4 never came
    assert dump["context"]["last_batch"] == [
        {"path": "batch[0]", "shape": [4, 8], "dtype": "float32"},
        {"path": "batch[1]", "shape": [4, 1], "dtype": "float32"},
    ]
    assert dump["context"]["seeds"]["torch.manual_seed"] == 1235
    loader = json.loads((run_dir / "ranks" / "1" / "loader.json").read_text())
    if scenario == "data-hang":
        assert main_thread(dump)[-1]["function"] == "__getitem__"
        assert loader["worker_pids"] == []
    else:  # the rank waits on its workers; their pids are recorded for the collector
        assert len(loader["worker_pids"]) == 2 and dump["dataloader"]["num_workers"] == 2
    # rank 0 waits for it: in its own all_reduce, or (DDP) in backward(), where the reducer's all_reduce waits
    assert latest_pydump(run_dir, 0)["context"]["phase"] == ("collective" if scenario == "data-hang" else "backward")
    names = bundle_names(run_dir)
    assert {"ranks/1/pydump-1.json", "ranks/1/loader.json", "ranks/1/threads.json"} <= set(names)
    # py-spy took every rank's stacks from outside, and the stuck loader worker's too
    assert {"ranks/0/py-spy.json", "ranks/1/py-spy.json"} <= set(names)
    if scenario == "ddp-data-hang-workers":
        (bundle,) = bundles(run_dir)
        files = read_bundle(str(bundle)).files
        workers = [json.loads(files[n]) for n in names if n.startswith("ranks/1/py-spy-worker-")]
        assert len(workers) == 2
        functions = {f["name"] for w in workers for t in w for f in t["frames"]}
        assert any(name.endswith("__getitem__") for name in functions)  # the worker stuck reading the FIFO


def test_without_py_spy_the_bundle_says_why(tmp_path: Path) -> None:
    run_dir, res = run_scenario(tmp_path, "data-hang", 1, env={"BLACKBOX_PYSPY": "/nonexistent/py-spy"})
    assert res.returncode == 86, res.stderr
    (bundle,) = bundles(run_dir)
    with tarfile.open(bundle) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        names = tar.getnames()
    step = next(s for s in manifest["steps"] if s["name"] == "py-spy")
    assert step["status"] == "failed" and "BLACKBOX_PYSPY=/nonexistent/py-spy is not an executable" in step["detail"]
    assert "ranks/1/pydump-1.json" in names and not any("py-spy" in n for n in names)  # everything else is there


@pytest.mark.gallery("ckpt-hang")  # its row runs with --checkpoint-timeout 4
def test_checkpoint_hang(gallery: Gallery) -> None:
    run_dir, res = gallery("ckpt-hang")
    assert res.exit_code == 86, res.stderr
    assert read_heartbeat(run_dir, 0).phase == "checkpoint"
    # torch.save opens the file from C++ holding the GIL: only the C-level dump can see it
    text = (run_dir / "ranks" / "0" / "stacks-0.txt").read_text()
    assert "in save" in text and "train.py" in text
    err = res.stderr
    assert "made no progress" in err and "verdict: hang.checkpoint_io, suspect rank(s) 0, phase checkpoint" in err


@pytest.mark.gallery("gil-hang")
def test_gil_held_in_c_still_dumps_on_sigusr1(gallery: Gallery) -> None:
    run_dir, res = gallery("gil-hang")
    assert res.exit_code == 86, res.stderr
    text = (run_dir / "ranks" / "1" / "stacks-0.txt").read_text()
    # faulthandler dumped from C while the rank's own Python thread could not run
    assert "Current thread" in text and "train.py" in text and "in main" in text
    threads = json.loads((run_dir / "ranks" / "1" / "threads.json").read_text())
    assert "MainThread" in threads.values()
    assert any(tid in text for tid in threads)  # the map names the hex ids faulthandler prints
    # the bundle shows it too: rank 1's liveness thread had stopped while its process lived
    (bundle,) = bundles(run_dir)
    files = read_bundle(str(bundle)).files
    hb = {r: json.loads(files[f"ranks/{r}/heartbeat.json"]) for r in (0, 1)}
    assert hb[1]["alive"] and hb[1]["liveness_age_s"] > 2.5 > hb[0]["liveness_age_s"]


@pytest.mark.gallery("ddp-stopped")  # its row runs with --dump-timeout 30: a wait for the stopped rank would show
def test_a_stopped_rank_is_read_from_outside_and_not_waited_for(gallery: Gallery) -> None:
    # GIVEN a job whose rank 1 stops itself (SIGSTOP, as a job-control stop leaves it) while rank 0 waits for it
    run_dir, res = gallery("ddp-stopped")
    # WHEN blackbox collects the stall
    assert res.exit_code == 86, res.stderr
    (bundle,) = bundles(run_dir)
    files = read_bundle(str(bundle)).files
    manifest = json.loads(files["manifest.json"])
    steps = {s["name"]: s for s in manifest["steps"]}
    # THEN py-spy read the stopped rank without suspending it (it cannot be suspended again): its stack is there
    assert "stopped: read without suspending them (--nonblocking" in steps["py-spy"]["detail"], steps["py-spy"]
    threads = json.loads(files["ranks/1/py-spy.json"])
    frames = [(f["name"], f["filename"].rsplit("/", 1)[-1]) for t in threads for f in t["frames"]]
    assert ("main", "train.py") in frames, threads
    # AND it was neither asked nor signalled, nor waited for: rank 0 answered, the dump timeout was not spent
    detail = steps["rank dumps"]["detail"]
    assert detail.startswith("1/2 rank(s) wrote their dump; the dump signal to rank(s) [0]"), detail
    assert "rank(s) [1] stopped: not asked" in detail and "no answer within" not in detail, detail
    assert steps["rank dumps"]["duration_s"] < 10 and manifest["collection"]["duration_s"] < 25, steps
    assert "verdict: hang.stopped, suspect rank(s) 1" in res.stderr, res.stderr[-2000:]
    # AND the manifest says what the bundle holds of each rank, and why the stopped one wrote nothing of its own —
    # as the report reads it again from the members
    held = manifest["collection"]["evidence"]
    assert (held["1"]["stack"], held["1"]["why"]) == (["py-spy"], "stopped: it could not answer"), held
    assert held["0"]["stack"] == ["py-spy", "faulthandler", "its own dump"] and held["0"]["why"] is None, held
    assert {str(e["rank"]): e for e in analyze(read_bundle(str(bundle))).to_json()["evidence"]} == held


@pytest.mark.gallery("raise")
def test_exception_and_the_survivors_sigterm_last_words(gallery: Gallery) -> None:
    run_dir, res = gallery("raise")
    assert res.exit_code == 1
    (record,) = jsonl(run_dir / "ranks" / "1" / "exceptions.jsonl")
    assert record["type"] == "builtins.ValueError" and record["message"] == "bad sample at step 3"
    assert record["step"] == 2 and record["thread"] == "MainThread"
    assert record["traceback"][-1]["function"] == "main" and "raise ValueError" in record["traceback"][-1]["code"]
    assert record["last_batch"][0]["shape"] == [4, 8]
    assert "ValueError: bad sample at step 3" in res.stderr  # the job's own output is unchanged
    # the rank's heartbeat keeps saying how it ended (exit handlers run after an uncaught exception too)
    assert read_heartbeat(run_dir, 1).state == "exception"
    # blackbox collected at once, while the launcher had not yet torn the survivor down: one bundle. The rule that
    # fires is `exception` when a poll (woken by the traceback on the console) finds the rank between its exception
    # and its exit, milliseconds apart; under load the next poll finds it dead, and says it raised
    (raised,) = [e for e in jsonl(run_dir / "events.jsonl") if e["event"] in ("exception", "rank_death")]
    assert raised["ranks"] == [1] and "raised an" in raised["reason"] and "exception" in raised["reason"], raised
    (bundle,) = bundles(run_dir)
    with tarfile.open(bundle) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        survivor = json.loads(read_bundle(str(bundle)).files["ranks/0/py-spy.json"])
        # torchelastic's own error file is left as it was, and collected
        error = json.load(tar.extractfile("ranks/1/torchelastic-error.json"))  # type: ignore[arg-type]
    assert manifest["trigger"] == raised["event"].replace("_", "-")
    assert any(f["name"] == "main" for t in survivor for f in t["frames"])  # rank 0's stack, taken while alive
    assert "bad sample at step 3" in json.dumps(error)
    # torchrun tore rank 0 down with SIGTERM: its stacks were dumped from C first
    text = (run_dir / "ranks" / "0" / "sigterm.txt").read_text()
    assert "Current thread" in text and "in main" in text


@pytest.mark.gallery("ddp-oom")
def test_oom_record(gallery: Gallery) -> None:
    run_dir, res = gallery("ddp-oom")
    assert res.exit_code == 1
    (record,) = jsonl(run_dir / "ranks" / "0" / "oom.jsonl")
    assert record["message"].startswith("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert record["phase"] == "compute" and record["step"] == 2
    assert record["last_batch"] == [{"path": "batch[0]", "shape": [4, 8], "dtype": "float32"},
                                    {"path": "batch[1]", "shape": [4, 1], "dtype": "float32"}]  # fmt: skip
    assert record["memory_snapshot"] is None  # no CUDA here
    assert record["stack"][-1]["function"] == "main"


@pytest.mark.gallery("ddp-segv")
def test_segfault_leaves_a_native_dump(gallery: Gallery) -> None:
    run_dir, res = gallery("ddp-segv")
    assert res.exit_code != 0
    text = (run_dir / "ranks" / "1" / "fatal.txt").read_text()
    assert "Segmentation fault" in text and "train.py" in text


def test_user_sigusr1_handler_is_kept_behind_faulthandler(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "blackbox", "run", "--run-dir", str(run_dir), "--",
                             TORCHRUN, "--standalone", "--nproc-per-node", "2", JOB, "sigusr1-user", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)  # fmt: skip
    try:
        assert proc.stdout is not None
        seen = b""
        while seen.count(b"ready") < 2:
            line = proc.stdout.readline()
            assert line, seen
            seen += line
        events = jsonl(run_dir / "ranks" / "1" / "recorder-events.jsonl")
        assert any("re-registered" in e["what"] and e["signal"] == "SIGUSR1" for e in events)
        rank_pid = read_heartbeat(run_dir, 1).pid
        os.kill(rank_pid, signal.SIGUSR1)
        while b"user SIGUSR1 handler ran" not in seen:  # the job's handler still runs ...
            line = proc.stdout.readline()
            assert line, seen
            seen += line
        assert "Current thread" in (run_dir / "ranks" / "1" / "stacks-0.txt").read_text()  # ... after the dump
    finally:
        kill_tree(proc)


def test_blackbox_never_fires_the_jobs_own_sigusr1_handler(tmp_path: Path) -> None:
    # GIVEN a job that checkpoints on SIGUSR1 (as Slurm jobs do before a preemption), hung at step 2 in rank 1
    run_dir, res = run_scenario(tmp_path, "sigusr1-user", 1)
    # WHEN blackbox collects the stall and ends the job (every rank signalled for its dump at once)
    assert res.returncode == 86, res.stderr
    # THEN the job's handler never ran, and the dumps came through the recorder's own signal
    assert b"user SIGUSR1 handler ran" not in res.stdout, res.stdout[-2000:]
    dumps = "".join(p.read_text() for p in (run_dir / "ranks" / "1").glob("stacks-*.txt"))
    assert "Current thread" in dumps or "Thread 0x" in dumps
    (bundle,) = bundles(run_dir)
    with tarfile.open(bundle) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    step = next(s for s in manifest["steps"] if s["name"] == "rank dumps")
    assert "the dump signal to rank(s) [0, 1]" in step["detail"], step


def _has_fr_dump() -> bool:
    """Whether the torch the jobs run with has the unified flight-recorder dump (the recorder's own test of it)."""
    code = "import torch; c = torch._C._distributed_c10d; print(hasattr(c, '_dump_fr_trace'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return out.stdout.strip() == "True"


@pytest.mark.gallery("skip-allreduce")
def test_flight_recorder_names_the_rank_that_skipped(tmp_path: Path, gallery: Gallery) -> None:
    # GIVEN a job where rank 1 skips an all_reduce and rank 0 waits in it: a stall, collected
    run_dir, res = gallery("skip-allreduce")
    assert res.exit_code == 86, res.stderr
    files = sorted((run_dir / "flight_recorder").glob("fr_trace_*"))
    if not files and not _has_fr_dump():
        pytest.skip("this torch has no flight-recorder dump API (torch._C._distributed_c10d._dump_fr_trace)")
    assert files, "this torch can dump its flight recorder, and no rank's dump reached the run directory"
    # WHEN the dumps are read without unpickling code and normalised for torch's analyzer
    dumps = {str(p): fr.load_dump(p.read_bytes()) for p in files}
    statuses = [s for p, d in dumps.items() for s in fr.pg_status(fr.rank_of(p) or 0, d)]
    assert fr.stuck(statuses)[0].missing == [1]  # rank 1 never enqueued the all_reduce its group is stuck at
    fr.write_normalised(dumps, str(tmp_path / "fr"))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path / "fr")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    # THEN PyTorch's own analyzer names the rank that never joined
    assert "missing ranks: {1}" in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.gallery("ddp-stopped")
def test_a_stopped_ddp_ranks_place_in_the_collectives_is_torchs_count_in_its_ring(gallery: Gallery) -> None:
    # GIVEN a DDP job whose rank 1 stops itself between two steps: DDP's all-reduces come from C++ (no Python
    # collective in its ring), and a stopped rank writes no flight-recorder dump
    run_dir, res = gallery("ddp-stopped")
    assert res.exit_code == 86, res.stderr
    (bundle,) = bundles(run_dir)
    out = subprocess.run([*BLACKBOX, "report", str(bundle), "--format", "json", "--no-index"], capture_output=True,
                         env=job_env(), timeout=60)  # fmt: skip
    report = json.loads(out.stdout)
    # THEN its place comes from its ring: torch's count at its last edge is the collective before the one rank 0
    # waits in — the flight recorder's inference ("never entered #8") and the rank's own record agree
    (one,) = [e for e in report["evidence"] if e["rank"] == 1]
    assert one["position"] == ["its ring"] and one["complete"] and one["why"] == "stopped: it could not answer", one
    texts = [f["text"] for f in report["findings"]]
    waited = next(int(m.group(1)) for t in texts if (m := re.match(r"rank 1 never entered all_reduce #(\d+) ", t)))
    own = next(t for t in texts if t.startswith("rank 1's own record (its ring): "))
    assert re.match(rf"rank 1's own record \(its ring\): had issued collective #{waited - 1} of its default group by "
                    r"\d\d:\d\d:\d\d UTC \(torch's count\); in phase compute since ", own), (waited, own)  # fmt: skip
    assert "evidence: 2/2 rank(s) with a stack and their place in the collectives" in texts


@pytest.mark.gallery("ddp-kernel-hang")  # its row runs with --dump-timeout 30
def test_a_rank_in_uninterruptible_sleep_is_read_by_py_spy_without_waiting_to_suspend_it(gallery: Gallery) -> None:
    # GIVEN a job whose rank 1's main thread sleeps uninterruptibly in the kernel (D: a vfork whose child never
    # execs, as a hung mount would hold it), under a dump timeout long enough to show any wait for it
    run_dir, res = gallery("ddp-kernel-hang")
    assert res.exit_code == 86, res.stderr
    (bundle,) = bundles(run_dir)
    files = read_bundle(str(bundle)).files
    steps = {s["name"]: s for s in json.loads(files["manifest.json"])["steps"]}
    # THEN py-spy read it without suspending it (an attach would wait for the kernel to let the thread go: py-spy
    # gave up after its whole timeout before), and its Python stack is there, in the vfork
    assert "in uninterruptible sleep: read without suspending them (--nonblocking" in steps["py-spy"]["detail"], steps
    assert steps["py-spy"]["status"] == "ok" and steps["py-spy"]["duration_s"] < 10, steps["py-spy"]
    threads = json.loads(files["ranks/1/py-spy.json"])
    frames = [(f["name"], f["filename"].rsplit("/", 1)[-1]) for t in threads for f in t["frames"]]
    assert ("vfork_and_wait", "train.py") in frames, threads
    assert "verdict: hang.kernel, suspect rank(s) 1" in res.stderr, res.stderr[-2000:]


def test_a_rank_killed_inside_a_collective_leaves_its_place_in_its_ring(tmp_path: Path) -> None:
    # GIVEN a job whose rank 0 never enters an all_reduce that rank 1 waits in
    run_dir = tmp_path / "run"
    proc = start_blackbox(["run", "--run-dir", str(run_dir), "--stall-timeout", "120", "--kill-grace", "5", "--",
                           TORCHRUN, "--standalone", "--nproc-per-node", "2", JOB, "skip-allreduce", "0"],
                          tmp_path)  # fmt: skip
    try:
        wait_for(lambda: (run_dir / "ranks" / "1" / "heartbeat").exists() and read_heartbeat(run_dir, 1).step >= 2
                 and read_heartbeat(run_dir, 1).phase == "collective", 120, "rank 1 to wait in all_reduce")  # fmt: skip
        seq = read_heartbeat(run_dir, 1).collective_seq
        # WHEN rank 1 is killed there (SIGKILL, as the OOM killer does): it can write nothing more
        os.kill(read_heartbeat(run_dir, 1).pid, signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    (bundle,) = bundles(run_dir)
    # THEN its ring, read from its page without it, holds the collective it entered and never left
    ring = json.loads(read_bundle(str(bundle)).files["ranks/1/heartbeat.json"])["ring"]
    assert (ring[-1]["phase"], ring[-1]["collective"], ring[-1]["seq"]) == ("collective", "all_reduce", seq), ring
    assert [e["n"] for e in ring] == sorted(e["n"] for e in ring) and len(ring) > 4
    # AND the report names it: the dead rank's place comes from its ring
    res = subprocess.run([*BLACKBOX, "report", str(bundle), "--format", "json", "--no-index"], capture_output=True,
                         env=job_env(), timeout=60)  # fmt: skip
    report = json.loads(res.stdout)
    assert report["verdict"]["suspect_ranks"] == [1], report["verdict"]
    (one,) = [e for e in report["evidence"] if e["rank"] == 1]
    assert one["position"] == ["its ring"] and one["why"].startswith("it had ended"), one
    said = [f["text"] for f in report["findings"] if f["text"].startswith("rank 1's own record (its ring): ")]
    assert said and said[0].startswith(f"rank 1's own record (its ring): last entered all_reduce #{seq} at "), said
    assert ", never left; in phase collective since " in said[0], said
