"""Slurm's formats (adapters/slurm) and the node's shared watch (supervisor/node) on their own: node lists,
tasks per node, `scontrol show job`, a task's identity, the run directory's patterns, and the node's lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from blackbox.adapters import slurm
from blackbox.supervisor import node

SHOW_JOB = (
    "JobId=1234 JobName=train UserId=ana(1000) GroupId=ana(1000) MCS_label=N/A Priority=4294901757 Nice=0 "
    "Account=(null) QOS=(null) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) Requeue=1 Restarts=2 "
    "BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:01:25 TimeLimit=00:01:00 TimeMin=N/A "
    "StartTime=2026-12-01T15:13:49 EndTime=2026-12-01T15:15:14 Partition=gpu AllocNode:Sid=login1:5576 "
    "NodeList=gpu[003-004] BatchHost=gpu003 NumNodes=2 NumCPUs=16 NumTasks=16 CPUs/Task=1 "
    "TRES=cpu=16,node=2,billing=16 Command=/home/ana/run job.sh WorkDir=/home/ana"
)
TASK_ENV = {
    "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_TASKS": "16", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_NODES": "2", "SLURMD_NODENAME": "gpu004",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_STEP_NODELIST": "gpu[003-004]",
}  # fmt: skip


def test_node_lists_and_tasks_per_node() -> None:
    assert slurm.expand_nodelist("gpu[003-005,012],cpu1") == ["gpu003", "gpu004", "gpu005", "gpu012", "cpu1"]
    assert slurm.expand_nodelist("bbn[0-1]") == ["bbn0", "bbn1"] and slurm.expand_nodelist("") == []
    assert slurm.expand_nodelist("a[1-2]-ib") == ["a1-ib", "a2-ib"]
    assert [slurm.tasks_per_node("2(x3),1", i) for i in range(5)] == [2, 2, 2, 1, None]
    assert slurm.tasks_per_node("garbage", 0) is None


def test_scontrol_show_job_facts() -> None:
    fields = slurm.parse_show_job(SHOW_JOB)
    assert fields["TRES"] == "cpu=16,node=2,billing=16" and fields["Command"] == "/home/ana/run job.sh"
    facts = slurm.facts(fields)
    assert facts["job_id"] == "1234" and facts["partition"] == "gpu" and facts["node_list"] == "gpu[003-004]"
    assert facts["requeue_count"] == 2 and facts["nodes"] == 2 and facts["time_limit"] == "00:01:00"
    assert slurm.ending(facts)[0] == "time limit reached"  # asked after the job's processes ended: its final state
    assert slurm.ending({"state": "CANCELLED by 1000"})[0] == "cancelled (scancel)"


# What Slurm 22.05 said at the SIGTERM itself, in the test cluster (blackbox is a process of the job: until it ends,
# JobState is COMPLETING whatever ended the job): a time limit sets the Reason, a cancel sets nothing.
AT_TIME_LIMIT = "JobId=4 JobState=COMPLETING Reason=TimeLimit Restarts=0 TimeLimit=00:01:00 EndTime=2026-12-01T17:23:12"
AT_SCANCEL = "JobId=3 JobState=COMPLETING Reason=None Restarts=0 TimeLimit=UNLIMITED EndTime=2026-12-01T17:21:56"
# scontrol --json show job, Slurm 23.11 and later (data_parser v0.0.40): the state underneath, with its flags
JSON_CANCELLED = '{"jobs": [{"job_id": 3, "job_state": ["CANCELLED", "COMPLETING"], "state_reason": "None"}]}'


def test_why_slurm_ends_a_job_and_unknown_where_it_does_not_say() -> None:
    # GIVEN the job's facts at the moment Slurm's SIGTERM arrives
    def at(text: str, **more: object) -> dict[str, object]:
        return {**slurm.facts(slurm.parse_show_job(text)), **more}

    # THEN a time limit, a preemption and a requeue are known; a cancel is, where --json gives the state underneath
    assert slurm.ending(at(AT_TIME_LIMIT)) == ("time limit reached", "reason TimeLimit")
    assert slurm.ending(at(AT_SCANCEL, preempt_time="2026-12-01T17:21:56"))[0] == "preempted"
    assert slurm.ending(at(AT_SCANCEL.replace("Restarts=0", "Restarts=2")), restarts=1)[0] == "requeued"
    assert slurm.ending(at(AT_SCANCEL.replace("Restarts=0", "Restarts=1")), restarts=1)[0] == "unknown"
    states = slurm.job_states(JSON_CANCELLED)
    assert states == ["CANCELLED", "COMPLETING"]
    assert slurm.ending(at(AT_SCANCEL, states=states)) == ("cancelled (scancel)", "state CANCELLED+COMPLETING")
    assert slurm.ending(at(AT_SCANCEL, states=["COMPLETED", "COMPLETING"]))[0].startswith("the job's allocation")
    # AND a cancel without --json is unknown, with what Slurm did say; so is a step ended while the job runs
    cause, why = slurm.ending(at(AT_SCANCEL))
    assert cause == "unknown" and "COMPLETING" in why and "scancel" in why and "not the time limit" in why
    cause, why = slurm.ending({"state": "RUNNING", "reason": "None"})
    assert cause == "unknown" and "this step alone" in why
    assert slurm.ending({}) == ("unknown", "no state from Slurm")
    # AND scontrol's answers that are not the job's states are none
    assert slurm.job_states('{"jobs": [{"job_state": "COMPLETING"}]}') == ["COMPLETING"]  # 23.02: one word
    assert slurm.job_states("scontrol: unrecognized option '--json'") is None
    assert slurm.job_states('{"jobs": []}') is None and slurm.job_states("[1]") is None


def fake_scontrol(tmp_path: Path, refusals: int, refusal: str, answer: str) -> tuple[dict[str, str], Path]:
    """A stand-in for `scontrol` (this machine's Slurm is older than `--json`'s state list) on PATH: it refuses
    `refusals` times with `refusal` on stderr, then prints `answer`; each call is counted in the returned file."""
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir(parents=True)
    script.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
if [ "$(wc -l < {calls})" -le {refusals} ]; then echo '{refusal}' >&2; exit 1; fi
echo '{answer}'
""")
    script.chmod(0o755)
    return {"PATH": f"{script.parent}:/usr/bin:/bin"}, calls


def test_a_busy_controller_is_asked_again_and_an_older_slurm_once(tmp_path: Path) -> None:
    import time

    # GIVEN a controller that times out twice before it answers (a Slurm busy ending many jobs)
    env, calls = fake_scontrol(tmp_path / "busy", 2, "slurm_load_jobs error: Socket timed out on send/recv operation",
                               JSON_CANCELLED)  # fmt: skip
    # THEN the state list comes on the third question, within the deadline
    assert slurm.ask_job_states("3", time.monotonic() + 5.0, env) == ["CANCELLED", "COMPLETING"]
    assert len(calls.read_text().splitlines()) == 3
    # GIVEN a Slurm without `--json` (before 23.02): it refuses the option
    env, calls = fake_scontrol(tmp_path / "old", 99, "scontrol: unrecognized option '--json'", "")
    started = time.monotonic()
    # THEN it is asked once: asking again would only wait out the deadline
    assert slurm.ask_job_states("3", started + 5.0, env) is None
    assert len(calls.read_text().splitlines()) == 1 and time.monotonic() - started < 2.0
    # GIVEN `scontrol show job` refused once: asked again too
    env, calls = fake_scontrol(tmp_path / "show", 1, "slurm_load_jobs error: Unable to contact slurm controller",
                               SHOW_JOB)  # fmt: skip
    facts, how = slurm.ask_job("1234", time.monotonic() + 5.0, env)
    assert facts is not None and facts["state"] == "TIMEOUT" and how == "scontrol show job"


def test_a_task_of_a_step_and_not_a_batch_script() -> None:
    task = slurm.task_of(TASK_ENV)
    assert task is not None
    assert (task.rank, task.local_rank, task.tasks, task.node_index, task.nodes, task.tasks_here, task.node) == (
        9, 1, 16, 1, 2, 8, "gpu004")  # fmt: skip
    assert task.key == "1234.0"
    assert slurm.task_of({**TASK_ENV, "SLURM_RESTART_COUNT": "1"}).key == "1234.0-r1"  # type: ignore[union-attr]
    batch = {k: v for k, v in TASK_ENV.items() if k != "SLURM_STEP_ID"}  # a batch script: no step
    assert slurm.task_of(batch) is None and slurm.job_id_of(batch) == "1234"
    assert slurm.task_of({**TASK_ENV, "SLURM_STEP_ID": "batch"}) is None
    argv = slurm.srun_each_node("1234", ["gpu003", "gpu004"], ["python", "-m", "blackbox"])
    assert "--overlap" in argv and "--jobid=1234" in argv and "--nodelist=gpu003,gpu004" in argv
    assert argv[-3:] == ["python", "-m", "blackbox"]


def test_the_run_directory_of_a_nodes_tasks(tmp_path: Path) -> None:
    task = slurm.task_of(TASK_ENV)
    assert task is not None
    assert node.run_dir_of(None, "runs", task) == "runs/slurm-1234.0/gpu004"
    assert node.run_dir_of("out/%j/%N-%n.%s/100%%", "runs", task) == "out/1234/gpu004-1.0/100%"
    again = slurm.task_of({**TASK_ENV, "SLURM_RESTART_COUNT": "2"})
    assert again is not None
    assert node.run_dir_of("out/%j/%N", "runs", again) == "out/1234/gpu004/restart2"  # beside the last run
    assert node.run_dir_of("out/%j.%r/%N", "runs", again) == "out/1234.2/gpu004"
    assert node.run_dir_of(None, "runs", again) == "runs/slurm-1234.0-r2/gpu004"


@pytest.fixture
def shares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[node.NodeShare, node.NodeShare]:
    """Two tasks of one node, their lock files under tmp_path."""
    monkeypatch.setattr(node.tempfile, "gettempdir", lambda: str(tmp_path))
    task = slurm.task_of(TASK_ENV)
    assert task is not None
    return node.NodeShare(task, str(tmp_path / "run")), node.NodeShare(task, str(tmp_path / "run"))


def test_the_nodes_lock_passes_from_task_to_task(shares: tuple[node.NodeShare, node.NodeShare]) -> None:
    a, b = shares
    a.join()
    b.join()
    assert a.try_lead() and a.first  # nobody led this run before
    assert not b.try_lead() and b.holder()["state"] == "leading"
    a.release()  # its own task ended: handed over
    assert b.try_lead() and not b.first and not b.took_over_from_dead()
    assert b.before["state"] == "handed over"
    assert not a.leave()  # b is still a member
    b.mark_stall_ended()  # nothing to mark without the run directory: no error
    b.release()
    assert b.leave()  # the last one out: the files go
    assert not Path(a.lock_path).exists() and not Path(a.members_path).exists()


def test_a_dead_holder_is_told_from_a_handed_over_one(shares: tuple[node.NodeShare, node.NodeShare],
                                                       tmp_path: Path) -> None:  # fmt: skip
    a, b = shares
    assert a.try_lead()
    assert a._fd is not None
    import os

    os.close(a._fd)  # what a SIGKILL does: the lock is gone, its record still says "leading"
    a._fd, a.leading = None, False
    assert b.try_lead() and b.took_over_from_dead()
    other = node.NodeShare(b.task, str(tmp_path / "another-run"))  # a stale lock of another run says nothing
    b.release()
    assert other.try_lead() and other.first
    other.close()


def test_collecting_a_job_that_is_not_running_is_one_sentence_and_leaves_no_directory(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    # GIVEN a job that ended (TIMEOUT), then a Slurm that cannot be reached (scontrol's steps, then its last word)
    ended, _ = fake_scontrol(tmp_path / "ended", 0, "", SHOW_JOB)
    lost, _ = fake_scontrol(tmp_path / "lost", 9, "scontrol: error: fetch_config: DNS SRV lookup failed\\n"
                            "scontrol: fatal: Could not establish a configuration source", "")  # fmt: skip
    for env, said in ((ended, "Slurm job `1234` is not running (state `TIMEOUT`): there is nothing to collect."),
                      (lost, "Cannot read Slurm job `1234`: scontrol: fatal: Could not establish a configuration "
                             "source.")):  # fmt: skip
        work = tmp_path / f"cwd-{len(os.listdir(tmp_path))}"
        work.mkdir()
        res = subprocess.run([sys.executable, "-m", "blackbox", "collect", "--slurm-job", "1234"], cwd=work,
                             env={**os.environ, "PATH": env["PATH"] + ":" + os.environ["PATH"]}, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        # THEN one sentence, a non-zero exit, and no empty directory named in a line before it
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
        assert f"blackbox: error: {said}" in res.stderr, res.stderr
        assert list(work.iterdir()) == [], list(work.iterdir())
