"""The collector end to end: `blackbox collect PID` on jobs started without blackbox, its safety rules (no
signal to a process without a handler, the job keeps running), a missing py-spy, fatal console lines inside
`blackbox run`, and secrets that must not reach the bundle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from blackbox._recorder import protocol as P
from blackbox.adapters import pyspy
from blackbox.adapters.procfs import is_alive
from blackbox.bundle.reader import read_bundle
from blackbox.events import read_events
from blackbox.supervisor.rundir import INJECT_DIR
from tests import conftest
from tests.conftest import (
    BLACKBOX,
    PROGRAMS,
    ROOT,
    TORCHRUN,
    bundles,
    job_env,
    kill_tree,
    run_blackbox,
    send,
    start_blackbox,
    wait_for,
)  # fmt: skip

GLOO_JOB = str(PROGRAMS / "gloo_job.py")


def members(bundle: Path) -> dict[str, bytes]:
    """The bundle's members as a reader sees them (the rank table's records as ranks/<r>/<name>)."""
    return read_bundle(str(bundle)).files


def manifest_step(files: dict[str, bytes], name: str) -> dict[str, Any]:
    (step,) = [s for s in json.loads(files["manifest.json"])["steps"] if s["name"] == name]
    return step  # type: ignore[no-any-return]


def collect(pid: int, out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*BLACKBOX, "collect", str(pid), "--out", str(out), "--format", "json", *extra],
                          env=env or job_env(), capture_output=True, timeout=120, cwd=out.parent)  # fmt: skip


@pytest.fixture(scope="module")
def plain_torchrun(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """A 2-rank gloo job started with plain torchrun, no blackbox: rank 1 hangs at step 3, rank 0 waits. One job for
    the module's collections of it: each test collects it once more and checks that it runs on, untouched."""
    base = tmp_path_factory.mktemp("plain-torchrun")
    markers = base / "markers"
    markers.mkdir()
    agent = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "2", GLOO_JOB, "--steps", "100000",
                              "--misbehave-rank", "1", "--at-step", "3", "--marker-dir", str(markers)],
                             env=job_env(), cwd=base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # fmt: skip
    conftest.SERVICES.add(agent.pid)  # the reaper after each test spares it and its ranks
    try:
        wait_for(lambda: (markers / "rank1.hanging").exists(), 90, "rank 1 to hang")
        ranks = [c.pid for c in psutil.Process(agent.pid).children()]
        assert len(ranks) == 2
        yield agent, ranks
    finally:
        conftest.SERVICES.discard(agent.pid)
        kill_tree(agent)


@pytest.mark.parametrize("via", ["agent", "rank", "rank 1"])
@pytest.mark.xdist_group("plain-torchrun")
def test_collect_finds_every_rank_and_leaves_the_job_running(
    tmp_path: Path, plain_torchrun: tuple[subprocess.Popen[bytes], list[int]], via: str
) -> None:
    agent, ranks = plain_torchrun
    # WHEN blackbox collect is given the agent's pid, or either rank's
    pid = {"agent": agent.pid, "rank": ranks[0], "rank 1": ranks[1]}[via]
    res = collect(pid, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    outcome = json.loads(res.stdout)
    # THEN both ranks were found, with stacks from py-spy and /proc state, and the agent too
    assert sorted(r["rank"] for r in outcome["ranks"]) == [0, 1]
    assert sorted(r["pid"] for r in outcome["ranks"]) == sorted(ranks)
    files = members(Path(outcome["bundle"]))
    for rank in (0, 1):
        stacks = json.loads(files[f"ranks/{rank}/py-spy.json"])
        assert any(f["name"] == "main" for t in stacks for f in t["frames"])
        proc = json.loads(files[f"ranks/{rank}/proc.json"])
        assert proc["pid"] in ranks and proc["threads"] and proc["fd_count"] > 0
    assert "agent/py-spy.json" in files
    hung = json.loads(files["ranks/1/py-spy.json"])
    assert any("sleep" in str(f.get("name")) or f["line"] for t in hung for f in t["frames"])
    node = json.loads(files["node.json"])
    assert node["hostname"] and "gpus" in node and node["command"][1].endswith("torchrun")
    assert manifest_step(files, "py-spy")["status"] == "ok"
    assert manifest_step(files, "rank dumps")["status"] == "skipped"  # no recorder here: nothing to ask
    # AND the report, from stacks alone, names rank 1 (not in the collective rank 0 waits in) as the suspect
    if via == "agent":
        # the collection went into the incident index
        listed = subprocess.run([*BLACKBOX, "incidents", "list", "--limit", "100000", "--format", "json"],
                                capture_output=True, env=job_env(), timeout=60, check=True)  # fmt: skip
        assert outcome["bundle"] in [i["bundle"] for i in json.loads(listed.stdout)["incidents"]]
        rep = subprocess.run([*BLACKBOX, "report", outcome["bundle"], "--format", "json"], capture_output=True,
                             env=job_env(), timeout=60)  # fmt: skip
        verdict = json.loads(rep.stdout)["verdict"]
        assert verdict["suspect_ranks"] == [1] and verdict["category"] == "hang.compute", verdict
    # AND the job goes on, untouched
    assert agent.poll() is None and all(is_alive(p) for p in ranks)
    assert oct(Path(outcome["bundle"]).stat().st_mode & 0o777) == "0o600"


def test_a_rank_that_cannot_run_python_is_not_signalled_and_its_watchdog_dumps_through_the_debug_pipe(
    tmp_path: Path,
) -> None:
    # GIVEN a process under the recorder that cannot answer (GIL held in C), with no handler for the dump signal, and
    # torch's debug pipe, read by a thread that needs no GIL (on NCCL, torch's watchdog; here a child in its place:
    # tests/programs/watchdog_rank.py), beside a regular file where another rank's pipe would be
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    fr_dir = run_dir / P.FR_DIR
    fr_dir.mkdir(mode=0o700)
    ready = tmp_path / "ready"
    env = job_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", PYTHONPATH=INJECT_DIR, TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(
        fr_dir / "pipe_"), **{P.ENV_RUN_DIR: str(run_dir), P.ENV_FR_DIR: str(fr_dir)})  # fmt: skip
    shell = subprocess.Popen(["sh", "-c", f'"{sys.executable}" "{PROGRAMS / "watchdog_rank.py"}" "{ready}" '
                              f'"{tmp_path / "rendezvous"}"; true'], env=env)  # fmt: skip
    wait_for(ready.exists, 60, "the process to hold the GIL")
    (target,) = [p for p in psutil.Process(shell.pid).children() if p.name() != "sh"]
    time.sleep(4)  # its liveness thread still for longer than a rank that can answer ever is (rank_dumps.FROZEN_MIN_S)
    # WHEN blackbox collect asks it for a dump
    res = collect(target.pid, tmp_path / "out", "--dump-timeout", "5")
    assert res.returncode == 0, res.stderr
    files = members(Path(json.loads(res.stdout)["bundle"]))
    # THEN it was asked the quiet way, not signalled, and it is alive; py-spy still saw it
    step = manifest_step(files, "rank dumps")
    assert step["status"] == "partial" and "dump signal is not registered, not signalled" in step["detail"], step
    assert target.is_running() and target.status() != psutil.STATUS_ZOMBIE
    assert "ranks/0/py-spy.json" in files and "ranks/0/heartbeat.json" in files
    # AND its flight recorder came through the pipe, said so, and is the rank's place in the collectives
    said = "the flight recorder of rank(s) [0] written by torch's NCCL watchdog, asked through its debug pipe"
    assert said in step["detail"] and step["duration_s"] < 5, step
    assert f"{P.FR_DIR}/{P.FR_PREFIX}0" in files
    rep = subprocess.run([*BLACKBOX, "report", json.loads(res.stdout)["bundle"], "--format", "json", "--no-index"],
                         capture_output=True, env=job_env(), timeout=60)  # fmt: skip
    (held,) = json.loads(rep.stdout)["evidence"]
    assert held["rank"] == 0 and "flight recorder" in held["position"], held


def test_a_job_not_under_blackbox_gives_its_flight_recorder_through_torchs_debug_pipe(tmp_path: Path) -> None:
    # GIVEN a rank started without blackbox, torch's flight recorder and debug pipe named in its environment as a
    # user sets them, its Python stuck with the GIL held in C (tests/programs/watchdog_rank.py: a child stands in for
    # NCCL's watchdog thread)
    ready = tmp_path / "ready"
    env = job_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
                  TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(tmp_path / "nccl_trace_rank_"),
                  TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(tmp_path / "nccl_pipe_"))  # fmt: skip
    rank = subprocess.Popen([sys.executable, str(PROGRAMS / "watchdog_rank.py"), str(ready),
                             str(tmp_path / "rendezvous")], env=env)  # fmt: skip
    try:
        wait_for(ready.exists, 60, "the process to hold the GIL")
        # WHEN blackbox collect is pointed at it
        res = collect(rank.pid, tmp_path / "out")
        assert res.returncode == 0, res.stderr
        files = members(Path(json.loads(res.stdout)["bundle"]))
        # THEN torch's watchdog was asked through the pipe, said so, and its dump is the rank's flight recorder
        step = manifest_step(files, "rank dumps")
        said = "the flight recorder of rank(s) [0] written by torch's NCCL watchdog, asked through its debug pipe"
        assert step["status"] == "ok" and said in step["detail"], step
        assert files[f"{P.FR_DIR}/{P.FR_PREFIX}0"] == (tmp_path / "nccl_trace_rank_0").read_bytes()
        rep = subprocess.run([*BLACKBOX, "report", json.loads(res.stdout)["bundle"], "--format", "json",
                              "--no-index"], capture_output=True, env=job_env(), timeout=60)  # fmt: skip
        (held,) = json.loads(rep.stdout)["evidence"]
        assert held["rank"] == 0 and "flight recorder" in held["position"], held
        assert rank.poll() is None  # and it runs on, untouched
    finally:
        rank.kill()
        rank.wait()


@pytest.mark.xdist_group("plain-torchrun")
def test_a_py_spy_too_slow_for_its_time_is_run_once_more(
    tmp_path: Path, plain_torchrun: tuple[subprocess.Popen[bytes], list[int]]
) -> None:
    agent, ranks = plain_torchrun
    # GIVEN a machine too busy for py-spy's first read of each process to finish within --dump-timeout (played by a
    # py-spy whose first run per process outlasts it; the second is the real one)
    real, _ = pyspy.find()
    slow = tmp_path / "py-spy"
    slow.write_text(f"""#!/bin/sh
pid=; prev=; for arg in "$@"; do [ "$prev" = --pid ] && pid=$arg; prev=$arg; done
[ -e "{tmp_path}/read-$pid" ] || {{ : > "{tmp_path}/read-$pid"; exec sleep 30; }}
exec "{real}" "$@"
""")
    slow.chmod(0o755)
    # WHEN blackbox collect reads the job
    res = collect(agent.pid, tmp_path / "out", "--dump-timeout", "3", env=job_env(BLACKBOX_PYSPY=str(slow)))
    assert res.returncode == 0, res.stderr
    files = members(Path(json.loads(res.stdout)["bundle"]))
    # THEN each process was read once more, given twice as long, and every stack is in the bundle
    step = manifest_step(files, "py-spy")
    assert step["status"] == "ok", step
    assert f"pids {sorted([agent.pid, *ranks])}: py-spy did not finish within 3 s, read once more" in step["detail"]
    assert "ranks/0/py-spy.json" in files and "ranks/1/py-spy.json" in files and "agent/py-spy.json" in files
    assert agent.poll() is None


@pytest.mark.xdist_group("plain-torchrun")
def test_py_spy_missing_still_gives_a_bundle(
    tmp_path: Path, plain_torchrun: tuple[subprocess.Popen[bytes], list[int]]
) -> None:
    agent, ranks = plain_torchrun
    # GIVEN blackbox run from an interpreter with no py-spy beside it, and a PATH without one
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = job_env(PYTHONPATH=f"{ROOT}{os.pathsep}{site}", PATH="/usr/bin:/bin")
    res = subprocess.run([sys._base_executable, "-m", "blackbox", "collect", str(agent.pid), "--out",
                          str(tmp_path / "out"), "--format", "json"], env=env, capture_output=True,
                         timeout=120)  # fmt: skip
    # THEN the bundle is there, the py-spy step failed with the reason and the fix, the rest was collected
    assert res.returncode == 0, res.stderr
    files = members(Path(json.loads(res.stdout)["bundle"]))
    step = manifest_step(files, "py-spy")
    assert step["status"] == "failed" and "py-spy is not installed: pip install py-spy" in step["detail"]
    assert "ranks/0/proc.json" in files and "ranks/1/proc.json" in files and "node.json" in files
    assert b"py-spy: failed: py-spy is not installed" in res.stderr
    # AND the report, with no stack of either rank, says it cannot tell (not that the hung job is fine)
    rep = subprocess.run([*BLACKBOX, "report", json.loads(res.stdout)["bundle"], "--format", "json"],
                         capture_output=True, env=job_env(), timeout=60)  # fmt: skip
    verdict = json.loads(rep.stdout)["verdict"]
    assert (verdict["category"], verdict["suspect_ranks"]) == ("hang.unknown", [0, 1]), verdict
    assert agent.poll() is None


@pytest.mark.parametrize(
    ("target", "sentence"), [("gone", "No process with pid"), ("sleep", "is not a Python process")]
)
def test_collect_bad_pid_is_one_sentence(tmp_path: Path, target: str, sentence: str) -> None:
    if target == "gone":
        done = subprocess.Popen(["true"])
        done.wait()
        pid = done.pid
    else:
        pid = subprocess.Popen(["sleep", "600"]).pid
    res = collect(pid, tmp_path / "out")
    err = res.stderr.decode()
    assert res.returncode == 2 and sentence in err and "Traceback" not in err, err
    assert err.startswith("blackbox: error: ") and not (tmp_path / "out").exists()


def test_collect_a_process_outside_any_job(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=job_env())
    wait_for(lambda: psutil.Process(proc.pid).cmdline()[-1:] == ["import time; time.sleep(600)"], 10, "start")
    res = collect(proc.pid, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    assert b"not part of a torch job" in res.stderr and proc.poll() is None
    assert "ranks/0/py-spy.json" in members(Path(json.loads(res.stdout)["bundle"]))


# --- inside blackbox run ---------------------------------------------------------------------------------
def test_fatal_console_line_collects_at_once(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a job that prints NCCL's watchdog line and then lingers (as ranks do before the launcher kills them)
    code = ("import sys, time\nprint('[rank0]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600012 milliseconds before timing out.', "
            "file=sys.stderr, flush=True)\ntime.sleep(600)\n")  # fmt: skip
    proc = start_blackbox(["run", "--run-dir", str(run_dir), "--", sys.executable, "-c", code], tmp_path)
    # THEN a bundle is written right away, with the live rank's stacks, long before any stall timeout
    (bundle,) = wait_for(lambda: bundles(run_dir), 30, "the console-triggered bundle")  # type: ignore[misc]
    files = members(bundle)
    assert json.loads(files["manifest.json"])["trigger"] == "console-comm-timeout"
    assert "ranks/0/py-spy.json" in files and b"Watchdog caught" in files["console-tail.log"]
    send(proc, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert b"fatal output: the job printed" in err
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events if e["event"] == "fatal_line"] == ["comm_timeout"]


def test_ten_secrets_never_reach_the_bundle(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN ten secrets: in the job's environment, in the config file named on its command line, in its output
    secrets = {
        "HF_TOKEN": "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI2k",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "WANDB_API_KEY": "0f1e2d3c4b5a69788796a5b4c3d2e1f0aa55bb66",
        "DB_PASSWORD": "Tr0ub4dor-and-3-horses",
        "SERVICE_AUTH_BEARER": "b3arer-t0ken-value-0123456789",
        "SEED_OPENAI": "sk-proj-" + "Z" * 40,
        "PLAIN_NAMED": "ghp_" + "R" * 36,  # a GitHub token in an innocently named variable
    }
    in_config = {
        "api_token": "cfg-api-token-5f4e3d2c1b",
        "password": "cfg-passw0rd-9a8b7c",
        "private_key": "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
    }
    config = tmp_path / "train.yaml"
    config.write_text(
        "lr: 0.1\n"
        f"api_token: {in_config['api_token']}\n"
        f'password = "{in_config["password"]}"\n'
        f"-----BEGIN PRIVATE KEY-----\n{in_config['private_key']}\n-----END PRIVATE KEY-----\n"
    )
    values = [*secrets.values(), *in_config.values()]
    assert len(values) == 10
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--", sys.executable, str(PROGRAMS / "secrets_job.py"),
                        "--config", str(config)], tmp_path, **secrets)  # fmt: skip
    assert res.returncode == 1 and secrets["DB_PASSWORD"].encode() in res.stdout  # the job's output is its own
    # THEN the bundle holds the config file and the environment, and none of the ten values, anywhere
    (bundle,) = bundles(run_dir)
    files = members(bundle)
    assert any(name.startswith("node/config/") and name.endswith("train.yaml") for name in files)
    assert "node/env.json" in files and "console-tail.log" in files and "ranks/0/exceptions.jsonl" in files
    for name, data in files.items():
        for value in values:
            assert value.encode() not in data, f"a secret reached {name}"
    # AND nothing else blackbox wrote to disk holds them either
    for path in run_dir.rglob("*"):
        if path.is_file() and path.name != "heartbeat":
            data = path.read_bytes()
            assert not any(v.encode() in data for v in values), f"a secret reached {path}"


LOOP = "import time\nfor i in range(100000):\n    print('step', i, flush=True)\n    time.sleep(0.2)\n"


def test_collect_never_follows_what_the_job_planted(tmp_path: Path, run_dir: Path) -> None:
    """Links the job's user planted where blackbox reads (console.log, events.jsonl, rank files, the
    torchelastic error file its rank.json names, a config file on its command line) are never followed; a
    file not owned by the job's user is never read either (tests/unit/test_safeopen.py, which can give files
    to another user)."""
    # GIVEN a job under `blackbox run`
    config = tmp_path / "conf.yaml"  # a config file on the job's command line: collected, when it is the job's own
    job = start_blackbox(["run", "--run-dir", str(run_dir), "--", sys.executable, "-c", LOOP, "--config", str(config)],
                         tmp_path)  # fmt: skip
    try:
        rank_dir = run_dir / "ranks" / "0"
        wait_for(lambda: (rank_dir / "threads.json").exists() and psutil.Process(job.pid).children(), 60, "the rank")
        rank_pid = psutil.Process(job.pid).children()[0].pid
        # AND a private file elsewhere, and links to it planted where blackbox reads
        secret = tmp_path / "private" / "secret.txt"
        secret.parent.mkdir()
        secret.write_text("PRIVATE-CONTENT\n")
        secret.chmod(0o600)
        for planted in (run_dir / "console.log", run_dir / "events.jsonl", rank_dir / "metrics.json",
                        rank_dir / "recorder.log", tmp_path / "error-link.json", config):  # fmt: skip
            planted.unlink(missing_ok=True)
            planted.symlink_to(secret)
        error_file = {"torchelastic_error_file": str(tmp_path / "error-link.json")}
        (rank_dir / "rank.json").write_text(json.dumps(error_file))
        # WHEN it is collected from here (--direct: not by asking its supervisor)
        res = collect(rank_pid, tmp_path / "out", "--direct")
        assert res.returncode == 0, res.stderr
        # THEN nothing of the private file is in the bundle, and the job runs on
        files = members(Path(json.loads(res.stdout)["bundle"]))
        assert "ranks/0/py-spy.json" in files
        for name, data in files.items():
            assert b"PRIVATE-CONTENT" not in data, f"the private file reached {name}"
        assert job.poll() is None
    finally:
        job.terminate()
        job.communicate(timeout=30)


def loop_rank(job: subprocess.Popen[bytes], run_dir: Path) -> int:
    """The pid of the LOOP job's one process under `blackbox run` (not blackbox's helpers, which keep its command
    line), once its recorder has written."""

    def rank() -> list[int]:
        return [c.pid for c in psutil.Process(job.pid).children() if c.cmdline()[1:] == ["-c", LOOP]]

    wait_for(lambda: (run_dir / "ranks" / "0" / "threads.json").exists() and rank(), 60, "the rank")
    (pid,) = rank()
    return pid


def test_collect_asks_the_jobs_own_blackbox_run_to_collect(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a job under `blackbox run`
    job = start_blackbox(["run", "--run-dir", str(run_dir), "--", sys.executable, "-c", LOOP], tmp_path)
    try:
        rank_pid = loop_rank(job, run_dir)
        # WHEN `blackbox collect` is given its rank, from a process that is not blackbox's descendant (kubectl exec)
        res = collect(rank_pid, tmp_path / "out")
        # THEN the job's own blackbox collected ("collect now"): its bundle in the run, a copy where --out says
        assert res.returncode == 0, res.stderr
        assert f"runs under `blackbox run` (pid {job.pid}): asking it to collect (SIGUSR1)".encode() in res.stderr
        outcome = json.loads(res.stdout)
        assert (outcome["via"], outcome["supervisor_pid"]) == ("supervisor", job.pid)
        (bundle,) = bundles(run_dir)
        copy = Path(outcome["bundle"])
        assert bundle.name.endswith("-manual.tar.gz") and copy.parent == tmp_path / "out" and copy.name == bundle.name
        assert copy.read_bytes() == bundle.read_bytes() and oct(copy.stat().st_mode & 0o777) == "0o600"
        assert "ranks/0/py-spy.json" in members(copy)
        assert [e["action"] for e in read_events(str(run_dir / "events.jsonl")) if e["event"] == "signal"] == [
            "collect"
        ]
        # AND --direct reads the ranks from here, as for a job started without blackbox; the job runs on throughout
        res = collect(rank_pid, tmp_path / "direct", "--direct")
        assert res.returncode == 0, res.stderr
        assert b"asking it to collect" not in res.stderr and "steps" in json.loads(res.stdout)
        assert len(bundles(run_dir)) == 1 and job.poll() is None
    finally:
        job.terminate()
        job.communicate(timeout=30)


@pytest.mark.timeout(240)
def test_a_prestop_hook_collects_first_and_the_sigterm_then_reaches_the_jobs_own_handler_at_once(
    tmp_path: Path, run_dir: Path
) -> None:
    # GIVEN a 2-rank job in a pod (its environment says so) under `blackbox run`, whose ranks handle SIGTERM
    # themselves (a checkpoint on SIGTERM: each marks when it came and exits 0), and an alarm command
    markers = tmp_path / "markers"
    markers.mkdir()
    alarms = tmp_path / "alarms.txt"
    job = start_blackbox(["run", "--run-dir", str(run_dir), "--grace-budget", "10", "--on-incident",
                          f"echo $BLACKBOX_TRIGGER >> {alarms}", "--", TORCHRUN, "--standalone", "--nproc-per-node",
                          "2", GLOO_JOB, "--marker-dir", str(markers), "--steps", "100000", "--step-sleep", "0.02",
                          "--own-sigterm"], tmp_path, KUBERNETES_SERVICE_HOST="10.96.0.1")  # fmt: skip
    try:
        wait_for(lambda: (markers / "rank1.step3").exists(), 90, "rank 1 to step")
        # WHEN the kubelet runs the pod's preStop hook, `blackbox collect --preemption 1` (PID 1: blackbox; here its
        # pid), a process of the pod that is not blackbox's descendant
        res = subprocess.run([*BLACKBOX, "collect", "--preemption", str(job.pid), "--format", "json"],
                             env=job_env(), capture_output=True, timeout=120, cwd=tmp_path)  # fmt: skip
        # THEN the job's blackbox collected the preemption's evidence, and the job runs on until its SIGTERM
        assert res.returncode == 0, res.stderr
        assert b"asking it to collect (SIGUSR1, as the preemption's evidence)" in res.stderr
        (bundle,) = bundles(run_dir)
        assert bundle.name.endswith("-signal-prestop.tar.gz") and json.loads(res.stdout)["bundle"] == str(bundle)
        assert "ranks/1/py-spy.json" in members(bundle) and job.poll() is None
        assert not (run_dir / P.COLLECT_REQUEST).exists()  # answered once
        # AND when the SIGTERM follows, it reaches the job's own handlers at once: no second collection first
        sent = time.time()
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    came = [(markers / f"rank{r}.sigterm").stat().st_mtime - sent for r in (0, 1)]
    assert max(came) < 5.0, (came, err[-3000:])
    assert b"passed on at once" in err, err[-3000:]
    assert bundles(run_dir) == [bundle]
    events = read_events(str(run_dir / "events.jsonl"))
    assert [(e["signal"], e.get("after_prestop")) for e in events if e["event"] == "preemption"] == [
        ("preStop", None), ("SIGTERM", True)]  # fmt: skip
    # AND a preemption is no incident: no alarm was raised for either
    assert not alarms.exists()


@pytest.mark.timeout(120)
def test_a_prestop_hook_whose_supervisor_does_not_answer_says_so_and_takes_no_time_of_its_own(
    tmp_path: Path, run_dir: Path
) -> None:
    # GIVEN a job under `blackbox run` whose supervisor cannot answer now (stopped: as busy as it gets)
    job = start_blackbox(["run", "--run-dir", str(run_dir), "--", sys.executable, "-c", LOOP], tmp_path)
    try:
        rank_pid = loop_rank(job, run_dir)
        os.kill(job.pid, signal.SIGSTOP)
        try:
            # WHEN the pod's preStop hook asks it for the preemption's evidence, with a 2 s budget
            res = collect(rank_pid, tmp_path / "out", "--preemption", "--budget", "2")
        finally:
            os.kill(job.pid, signal.SIGCONT)
        # THEN it says why in one sentence and exits non-zero, without collecting from here: the grace period is
        # the pod's, and the supervisor collects on the SIGTERM that follows
        assert res.returncode != 0 and b"Traceback" not in res.stderr, res.stderr
        assert b"was asked for the preemption's evidence and it wrote no bundle within 2 s" in res.stderr
        assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
        assert not (run_dir / P.COLLECT_REQUEST).exists()  # withdrawn: a later SIGUSR1 is a plain "collect now"
    finally:
        job.terminate()
        job.communicate(timeout=30)
