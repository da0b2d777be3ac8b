"""Slurm, for real: a controller and two node daemons (bbn0, bbn1) on this machine (tests/slurm_cluster.py), and
real jobs submitted with srun and sbatch — ranks srun starts itself (SLURM_PROCID, no torchrun) under `blackbox
run`, `blackbox collect --slurm-job` on a hung job started without blackbox, scancel, a time limit with the job's
own SIGUSR1 warning, and scripts/slurm_example.sbatch requeued after a stall. The slow jobs start together, at
the module's start, and each test reads its own. Without root or without the packages the Slurm tests skip and
say why. The node-sharing tests at the end simulate two tasks of a node (srun's variables, no Slurm): the watch
handed over when its holder is killed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional, cast

import psutil
import pytest

from tests import conftest
from tests.conftest import BIN, BLACKBOX, ROOT, job_env, wait_for
from tests.integration.test_multinode import events, finish, manifest, report
from tests.ports import free_port
from tests.slurm_cluster import slurm_version

# one Slurm cluster of its own for the module; and apart from the other tests' jobs (`make test` runs it beside the
# throttled disks of test_flush.py alone: one light job at a time): beside them its daemons answered late (a time
# limit's cause `unknown`) and a collection's py-spy ran past its 5 s (a verdict `ok`), in two of three runs
pytestmark = [pytest.mark.alone, pytest.mark.xdist_group("slurm")]
TRAIN = ROOT / "scripts" / "scenarios" / "train.py"
EXAMPLE = ROOT / "scripts" / "slurm_example.sbatch"
PY = str(BIN / "python")
FAST = {"BLACKBOX_STALL_TIMEOUT": "4", "BLACKBOX_POLL_INTERVAL": "0.5", "BLACKBOX_KILL_GRACE": "3"}
NEVER = "/nonexistent/bb-never"  # BB_FAIL_WHEN that never comes: steps of 0.1 s until the job is ended
# the states of a job that has ended (squeue(1) "JOB STATE CODES"); "COMPLETING" is not one yet
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}  # fmt: skip


def named(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in events(run_dir) if e["event"] == name]


def node_facts(bundle: Path) -> dict[str, Any]:
    from blackbox.bundle import layout

    with tarfile.open(bundle) as tar:
        f = tar.extractfile(layout.NODE)
        assert f is not None
        data: dict[str, Any] = json.load(f)
        return data


class Jobs:
    """The module's jobs, submitted side by side."""

    def __init__(self, cluster: Any, base: Path) -> None:
        self.cluster = cluster
        self.base = base
        self.srun: dict[str, subprocess.Popen[str]] = {}
        self.batch: dict[str, str] = {}  # name -> job id

    def env(self, **extra: str) -> dict[str, str]:
        env = job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), **extra)
        env["SLURM_CONF"] = str(self.cluster.conf)
        return {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_")) or k == "SLURM_CONF"}

    def start_srun(self, name: str, args: list[str], **extra: str) -> None:
        d = self.base / name
        d.mkdir()
        self.srun[name] = subprocess.Popen(["srun", f"--job-name={name}", *args], cwd=d, env=self.env(**extra),
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           start_new_session=True)  # fmt: skip
        conftest.SERVICES.add(self.srun[name].pid)  # srun's client: the job ends with it

    def sbatch(self, name: str, args: list[str], **extra: str) -> str:
        d = self.base / name
        d.mkdir()
        res = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", f"--output={d}/slurm-%j.out", *args],
                             cwd=d, env=self.env(**extra), capture_output=True, text=True, timeout=30)  # fmt: skip
        assert res.returncode == 0, res.stderr
        self.batch[name] = res.stdout.strip().split(";")[0]
        return self.batch[name]

    def job_id(self, name: str) -> str:
        if name in self.batch:
            return self.batch[name]
        out = self.cluster.run("squeue", "-h", "-n", name, "-o", "%i", check=False)
        return out.split()[0] if out.split() else ""

    def show(self, job_id: str) -> dict[str, str]:
        # a slurmctld busy under the suite's load answers scontrol with an error now and then: ask again, so that
        # a missing answer never reads as "no longer RUNNING"
        def ask() -> dict[str, str]:
            text = self.cluster.run("scontrol", "show", "job", "-o", job_id, check=False)
            info = dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", text))
            return info if "JobState" in info else {}

        return cast(dict[str, str], wait_for(ask, 30, f"scontrol to show job {job_id}"))

    def finish(self, name: str) -> tuple[int, str]:
        return finish(self.srun[name])


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    import tests.slurm_cluster as sc

    root = tmp_path_factory.mktemp("slurm")
    try:
        cluster = sc.start(root / "cluster", nodes=2)
    except sc.Unavailable as exc:
        pytest.skip(str(exc))
    # the daemons, and below them (slurmd's reapers: tests/slurm_cluster.py) every slurmstepd and job process
    conftest.SERVICES.update(p.pid for p in cluster.procs)
    j = Jobs(cluster, root)
    try:
        train = [PY, str(TRAIN)]
        run = [PY, "-m", "blackbox", "run", "--"]
        # the gallery's data hang on task 1 of a 2-task step, ranks from SLURM_PROCID, under blackbox
        j.start_srun("hang", ["--nodes=1", "--ntasks=2", *run, *train, "data-hang", "1"], **FAST)
        # the same hang across two nodes (one task each) under blackbox, no secret named: the first task makes the
        # job's coordination secret in the submit directory, the other node reads it (the nodes' names do not
        # resolve here: the coordinator's address is given)
        coord = ["--coord", f"127.0.0.1:{free_port()}"]
        j.start_srun("twonode", ["--nodes=2", "--ntasks-per-node=1", *run[:-1], *coord, "--", *train, "data-hang", "1"],
                     **FAST)  # fmt: skip
        # the same hang across two nodes, started without blackbox: `collect --slurm-job` finds it
        j.sbatch("plain", ["--nodes=2", "--ntasks-per-node=1", "--wrap", f"srun {PY} {TRAIN} data-hang 1"])
        # healthy jobs to end: scancel; and a time limit, after the job's own SIGUSR1 warning
        j.start_srun("cancel", ["--nodes=1", "--ntasks=2", *run, *train, "data-hang", "9"], BB_FAIL_WHEN=NEVER)
        # (the warning a minute before the end: its ranks have a minute to install their handler on a loaded machine,
        # where 20 s was once too short)
        j.sbatch("timeout", ["--nodes=1", "--ntasks=2", "--time=2", "--signal=USR1@60", "--wrap",
                             f"srun {' '.join(run)} {' '.join(train)} sigusr1-user 9"], BB_FAIL_WHEN=NEVER)  # fmt: skip
        # the example job script: a stall (exit 86) requeues it; its second run is healthy
        wrapper = root / "train.sh"
        first, again = f"exec {PY} {TRAIN} data-hang 1", f"exec {PY} {TRAIN} healthy 9"
        wrapper.write_text(f'#!/bin/bash\nif [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then {first}; else {again}; fi\n')
        wrapper.chmod(0o755)
        j.sbatch("example", ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=2", "--time=10", str(EXAMPLE)],
                 TRAIN=str(wrapper), **FAST)  # fmt: skip
        yield j
    finally:
        for p in j.srun.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
        cluster.stop()
        conftest.SERVICES.difference_update([*(p.pid for p in cluster.procs), *(p.pid for p in j.srun.values())])


def run_dir_of(base: Path, name: str) -> Path:
    found = sorted((base / name / "blackbox-runs").glob("slurm-*/bbn*"))
    assert found, f"no run directory under {base / name}"
    return found[0]


def test_ranks_srun_starts_share_one_supervisor_and_get_the_gallery_verdict(jobs: Jobs) -> None:
    code, err = jobs.finish("hang")
    assert code == 86, err[-3000:]
    run_dir = run_dir_of(jobs.base, "hang")
    # one supervisor watched both tasks' ranks: one bundle, both ranks, the gallery's verdict
    bundles = sorted((run_dir / "bundles").glob("*.tar.gz"))
    assert len(bundles) == 1, err[-3000:]
    rep = report(bundles[0])
    assert rep["verdict"]["category"] == "hang.data_loading", rep["verdict"]
    assert rep["verdict"]["suspect_ranks"] == [1] and rep["verdict"]["phase"] == "data", rep["verdict"]
    assert sorted(r["rank"] for r in rep["ranks"]) == [0, 1]
    starts = named(run_dir, "rank_start")
    assert sorted(e["rank"] for e in starts) == [0, 1] and {e["mode"] for e in starts} == {"slurm"}, starts
    assert {e["world_size"] for e in starts} == {2}
    # both tasks passed the stall's exit code on; the run ended once, each task's end recorded
    assert [e["exit_code"] for e in named(run_dir, "end") + named(run_dir, "task_end")] == [86, 86]
    assert len(named(run_dir, "start")) == 1
    assert err.count("evidence bundle:") == 1, err  # the other task said nothing of its own
    slurm = node_facts(bundles[0])["slurm"]
    assert slurm["node_list"] == "bbn0" and slurm["partition"] == "debug" and slurm["tasks_on_node"] == 2, slurm
    assert slurm["requeue_count"] == 0 and slurm["job_id"].isdigit() and slurm["state"] == "RUNNING", slurm


def test_two_nodes_sign_with_the_secret_the_first_task_made_and_collect_together(jobs: Jobs) -> None:
    code, err = jobs.finish("twonode")
    assert code == 86, err[-3000:]
    # one secret, made by the first task in the job's submit directory (shared by its nodes), private and whole
    (secret,) = (jobs.base / "twonode" / ".blackbox").glob("coord-secret-*")
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes().strip()) >= 32, secret.stat()
    assert "unauthenticated" not in err, err[-3000:]
    run_dirs = sorted((jobs.base / "twonode" / "blackbox-runs").glob("slurm-*/bbn*"))
    assert [d.name for d in run_dirs] == ["bbn0", "bbn1"], run_dirs
    for d in run_dirs:
        # both nodes joined the signed store, believed every post (a wrong secret on one would reject the other's),
        # and each collected its own node's ranks for the one incident
        assert [e for e in named(d, "coordination") if e.get("status") == "connected"], events(d)
        assert not named(d, "coordination_rejected"), named(d, "coordination_rejected")
    bundles = [sorted((d / "bundles").glob("*.tar.gz")) for d in run_dirs]
    assert [len(b) for b in bundles] == [1, 1], err[-3000:]
    m0, m1 = manifest(bundles[0][0]), manifest(bundles[1][0])
    assert m0["incident"]["id"] == m1["incident"]["id"] and m0["multinode"]["job_id"] == m1["multinode"]["job_id"]
    merged = report(bundles[0][0], bundles[1][0])
    assert merged["verdict"]["category"] == "hang.data_loading" and merged["verdict"]["suspect_ranks"] == [1]


def still(job: str) -> bool:
    """Whether the ranks of a Slurm job use (next to) no CPU over half a second, each parked in its wait: on a loaded
    machine rank 0 may take a while to reach the collective its peer never joins."""
    ranks = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(TRAIN) in (p.info["cmdline"] or []) and p.environ().get("SLURM_JOB_ID") == job:
                ranks.append(p)
    if len(ranks) < 2:
        return False
    try:
        before = [sum(p.cpu_times()[:2]) for p in ranks]
        time.sleep(0.5)
        return all(sum(p.cpu_times()[:2]) - b < 0.02 for p, b in zip(ranks, before))
    except psutil.Error:
        return False


def test_collect_slurm_job_finds_a_hung_job_started_without_blackbox(jobs: Jobs, tmp_path: Path) -> None:
    job = jobs.batch["plain"]

    def hung() -> bool:
        out = next(iter((jobs.base / "plain").glob("slurm-*.out")), None)
        return out is not None and "rank 1: failing now" in out.read_text()

    wait_for(hung, 120, "rank 1 to hang")
    wait_for(lambda: still(job), 60, "the job's ranks to be still")  # rank 0 in the all_reduce rank 1 never joins
    res = subprocess.run([*BLACKBOX, "collect", "--slurm-job", job, "--out", str(tmp_path / "hung"), "--format",
                          "json", "--budget", "60"], capture_output=True, text=True, timeout=180,
                         env={**jobs.env(), "BLACKBOX_HOME": os.environ["BLACKBOX_HOME"]})  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(res.stdout)
    assert [n["node"] for n in data["nodes"]] == ["bbn0", "bbn1"], data["nodes"]
    assert all(n["bundle"] and os.path.exists(n["bundle"]) for n in data["nodes"]), data["nodes"]
    verdict = data["report"]["verdict"]
    assert verdict["category"] == "hang.data_loading" and verdict["suspect_ranks"] == [1], verdict
    assert sorted(r["rank"] for r in data["report"]["ranks"]) == [0, 1]
    assert "node bbn0:" in res.stderr and "node bbn1:" in res.stderr, res.stderr
    # the bundles read the same by `blackbox report DIR`, and the job still runs: collect ends nothing
    assert report(tmp_path / "hung")["verdict"]["suspect_ranks"] == [1]
    assert jobs.show(job)["JobState"] == "RUNNING"
    assert node_facts(Path(data["nodes"][0]["bundle"]))["slurm"]["job_id"] == job
    jobs.cluster.run("scancel", job)
    # a job that is not running is one sentence
    bad = subprocess.run([*BLACKBOX, "collect", "--slurm-job", "999999"], capture_output=True, text=True,
                         timeout=60, env=jobs.env(), cwd=jobs.base)  # fmt: skip
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "999999" in bad.stderr, bad.stderr


def test_scancel_is_a_preemption_with_the_jobs_own_exit_code(jobs: Jobs) -> None:
    run_dir = jobs.base / "cancel"
    wait_for(lambda: any(named(d, "first_step") for d in (run_dir / "blackbox-runs").glob("slurm-*/bbn*")), 120,
             "the cancel job to step")  # fmt: skip
    run_dir = run_dir_of(jobs.base, "cancel")
    wait_for(lambda: len(named(run_dir, "first_step")) == 2, 60, "both ranks to step")
    job = str(named(run_dir, "start")[0]["slurm_task"]["job_id"])
    jobs.cluster.run("scancel", job)
    code, err = jobs.finish("cancel")
    wait_for(lambda: named(run_dir, "end"), 30, "the run's end")
    pre = named(run_dir, "preemption")
    assert len(pre) == 1 and pre[0]["signal"] == "SIGTERM", pre
    # While any process of the job lives (blackbox is one), `scontrol show job` says COMPLETING whatever ended it,
    # and a cancel sets no Reason: only `scontrol --json` (Slurm 23.11 and later) says CANCELLED underneath. Before
    # that, why is unknown, and said to be, with what Slurm did say (not the time limit, not a preemption).
    slurm = pre[0]["slurm"]
    assert slurm is not None, pre  # slurm_source says why scontrol gave nothing
    assert slurm["state"] == "COMPLETING" and slurm["reason"] == "None" and slurm["job_id"] == job, pre
    if slurm_version() >= (23, 11):
        assert pre[0]["cause"] == "cancelled (scancel)" and "CANCELLED" in slurm["states"], pre
    else:
        assert pre[0]["cause"] == "unknown" and "scancel" in pre[0]["cause_source"], pre
        assert "why, it does not say" in err, err[-2000:]
    assert "recorded as a preemption, not an incident" in err, err[-2000:]
    assert not list((run_dir / "bundles").glob("*.tar.gz")), "a preemption is no incident"
    ends = named(run_dir, "end") + named(run_dir, "task_end")
    # the ranks died of the SIGTERM Slurm sent, passed on: 128 + 15, as a shell says it, on both tasks
    assert [e["exit_code"] for e in ends] == [143, 143] and all(e["job_exit_code"] == 143 for e in ends), ends
    assert not named(run_dir, "stall") and all(e.get("expected") for e in named(run_dir, "rank_death"))


@pytest.mark.timeout(300)
def test_the_time_limit_and_the_jobs_sigusr1_warning_pass_through(jobs: Jobs) -> None:
    job = jobs.batch["timeout"]
    wait_for(lambda: jobs.show(job)["JobState"] in ENDED, 210, "the time limit")
    assert jobs.show(job)["JobState"] == "TIMEOUT"
    run_dir = run_dir_of(jobs.base, "timeout")
    wait_for(lambda: named(run_dir, "end"), 30, "the run's end")
    output = next((jobs.base / "timeout").glob("slurm-*.out")).read_text()
    # Slurm's SIGUSR1 reached the job's own handler in both ranks, once each, and was recorded
    assert output.count("user SIGUSR1 handler ran") == 2, output[-3000:]
    pre = {e["signal"]: e for e in named(run_dir, "preemption")}
    assert set(pre) == {"SIGUSR1", "SIGTERM"}, pre
    assert pre["SIGTERM"]["cause"] == "time limit reached", pre
    assert pre["SIGTERM"]["slurm"]["reason"] == "TimeLimit" and pre["SIGUSR1"]["cause"] is None, pre
    assert not list((run_dir / "bundles").glob("*.tar.gz")), "a preemption is no incident"
    ends = named(run_dir, "end") + named(run_dir, "task_end")
    assert [e["exit_code"] for e in ends] == [143, 143], ends


def test_the_example_job_script_requeues_after_a_stall(jobs: Jobs) -> None:
    job = jobs.batch["example"]
    wait_for(lambda: jobs.show(job).get("Restarts") == "1", 150, "the example job to be requeued")
    # a requeued job may start again after the cluster's cred_expire (tests/slurm_cluster.py: 10 s, not 120)
    wait_for(lambda: jobs.show(job)["JobState"] in ENDED, 150, "the requeued run to finish")
    info = jobs.show(job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", info
    # each run's directory: runs/<job>/<node>, the requeued one's in restart1/ below; on whichever node Slurm gave it
    runs = jobs.base / "example" / "runs" / job
    firsts = [d for d in sorted(runs.glob("bbn*")) if (d / "events.jsonl").exists()]
    agains = sorted(runs.glob("bbn*/restart1"))
    assert len(firsts) == 1 and len(agains) == 1, sorted(runs.rglob("events.jsonl"))
    first, again = firsts[0], agains[0]
    bundles = sorted((first / "bundles").glob("*.tar.gz"))
    assert len(bundles) == 1, bundles
    rep = report(bundles[0])
    assert rep["verdict"]["category"] == "hang.data_loading" and rep["verdict"]["suspect_ranks"] == [1]
    assert [e["exit_code"] for e in named(first, "end") + named(first, "task_end")] == [86, 86]
    # the requeued run: its own run directory, the requeue count in its facts, a clean end
    assert named(again, "start")[0]["slurm_task"]["restarts"] == 1
    assert [e["exit_code"] for e in named(again, "end") + named(again, "task_end")] == [0, 0]
    assert not list((again / "bundles").glob("*.tar.gz"))


# --- the node's tasks, simulated (srun's variables, no Slurm) ------------------------------------------------
def task_env(task: int, port: int, fail_when: Path, **extra: str) -> dict[str, str]:
    return job_env(SLURM_JOB_ID="424242", SLURM_STEP_ID="0", SLURM_PROCID=str(task), SLURM_LOCALID=str(task),
                   SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2", SLURM_NODEID="0", SLURM_NNODES="1",
                   SLURM_STEP_TASKS_PER_NODE="2", SLURMD_NODENAME="simnode", SLURM_STEP_NODELIST="simnode",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), BB_FAIL_WHEN=str(fail_when), **extra)  # fmt: skip


def start_task(tmp: Path, task: int, port: int, run_dir: Path, then: str = "") -> subprocess.Popen[str]:
    # srun's task is the process itself: SLURM_TASK_PID is its own pid (exec keeps it)
    cmd = ["bash", "-c", 'export SLURM_TASK_PID=$$; exec "$@"', "task", *BLACKBOX, "run", "--run-dir",
           str(run_dir), "--stall-timeout", "4", "--poll-interval", "0.5", "--kill-grace", "3", "--",
           *(["bash", "-c", f'"$0" "$@"; {then}'] if then else []), PY, str(TRAIN), "data-hang", "1"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=tmp, env=task_env(task, port, tmp / "fail-now"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip


def holder(run_dir: Path) -> Optional[int]:
    taken = [e for e in events(run_dir) if e["event"] in ("start", "watch_taken")]
    return taken[-1]["pid"] if taken else None


def test_a_killed_node_supervisor_hands_its_watch_to_another_task(tmp_path: Path) -> None:
    port, run_dir = free_port(), tmp_path / "run"
    # task 0 leads (it starts first); task 1's rank is the one that will hang, and say so on its output (the
    # output of a task whose blackbox was killed goes nowhere: its rank would die of the broken pipe)
    tasks = [start_task(tmp_path, 0, port, run_dir)]
    wait_for(lambda: holder(run_dir), 60, "task 0 to lead")
    tasks.append(start_task(tmp_path, 1, port, run_dir))
    wait_for(lambda: len(named(run_dir, "first_step")) == 2, 90, "both ranks to step")
    leader, dead = holder(run_dir), 0
    assert leader == tasks[0].pid
    os.kill(leader, signal.SIGKILL)  # the node's supervisor only: its rank goes on, unwatched until taken over
    wait_for(lambda: named(run_dir, "watch_taken"), 30, "the other task to take the watch")
    taken = named(run_dir, "watch_taken")[0]
    assert taken["pid"] == tasks[1 - dead].pid and taken["previous_pid"] == leader and not taken["handed_over"]
    (tmp_path / "fail-now").touch()  # now rank 1 hangs in its loader
    code, err = finish(tasks[1 - dead])
    assert code == 86, err[-3000:]
    assert "ended without handing over" in err and "watches them now" in err, err
    bundles = sorted((run_dir / "bundles").glob("*.tar.gz"))
    assert len(bundles) == 1, err[-3000:]
    rep = report(bundles[0])
    assert rep["verdict"]["category"] == "hang.data_loading" and rep["verdict"]["suspect_ranks"] == [1]
    assert sorted(r["rank"] for r in rep["ranks"]) == [0, 1]  # the dead supervisor's rank was still watched
    tasks[dead].communicate(timeout=10)


def test_a_task_still_running_after_the_leaders_ending_takes_the_watch_as_that_ending(tmp_path: Path) -> None:
    port, run_dir = free_port(), tmp_path / "run"
    # task 0 leads; task 1 runs its rank from a script that cleans up for 20 s after it: task 0 ends the job (both
    # ranks die), and hands the watch over to task 1, still running, which finds every rank dead
    tasks = [start_task(tmp_path, 0, port, run_dir)]
    wait_for(lambda: holder(run_dir), 60, "task 0 to lead")
    tasks.append(start_task(tmp_path, 1, port, run_dir, then="sleep 20"))
    wait_for(lambda: len(named(run_dir, "first_step")) == 2, 90, "both ranks to step")
    (tmp_path / "fail-now").touch()
    (code0, err0), (code1, err1) = finish(tasks[0]), finish(tasks[1])
    assert (code0, code1) == (86, 86), err0[-3000:] + err1[-3000:]
    taken = named(run_dir, "watch_taken")
    assert [(e["pid"], e["handed_over"]) for e in taken] == [(tasks[1].pid, True)], taken
    # what follows is the ending task 0 began: one bundle, no second incident, no words of task 1's own; its
    # script is ended after the grace period, as task 0 would have ended it
    bundles = sorted((run_dir / "bundles").glob("*.tar.gz"))
    assert len(bundles) == 1 and "-stall" in bundles[0].name, err0[-3000:] + err1[-3000:]
    assert [e.get("followed", False) for e in named(run_dir, "end_job")] == [False, True], events(run_dir)
    assert named(run_dir, "kill") and all(e.get("expected") for e in named(run_dir, "rank_death")), events(run_dir)
    assert "evidence bundle:" not in err1 and "rank death" not in err1, err1[-3000:]
    assert [e["exit_code"] for e in named(run_dir, "end") + named(run_dir, "task_end")] == [86, 86]
