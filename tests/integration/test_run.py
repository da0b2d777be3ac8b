"""`blackbox run` end to end with real processes: transparency, exit codes, signals, activation in ranks
only, stall detection and bad input."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from blackbox.adapters.procfs import is_alive
from blackbox.bundle.reader import read_bundle
from blackbox.events import read_events
from blackbox.heartbeat_reader import decode
from tests.conftest import BLACKBOX, PROGRAMS, TORCHRUN, bundles, job_env, run_blackbox, send, start_blackbox, wait_for

GLOO_JOB = str(PROGRAMS / "gloo_job.py")


def events(run_dir: Path, name: str | None = None) -> list[dict[str, object]]:
    return [e for e in read_events(str(run_dir / "events.jsonl")) if name is None or e["event"] == name]


def heartbeat_pids(run_dir: Path) -> dict[int, int]:
    out = {}
    for hb_path in (run_dir / "ranks").glob("*/heartbeat"):
        with open(hb_path, "rb") as f:
            hb = decode(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        out[hb.rank] = hb.pid
    return out


# --- transparency -------------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [0, 1, 7])
def test_exit_code_passes_through(tmp_path: Path, run_dir: Path, code: int) -> None:
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--", sys.executable, "-c", f"raise SystemExit({code})"],
                       tmp_path)  # fmt: skip
    assert res.returncode == code, res.stderr
    assert events(run_dir, "end")[0]["exit_code"] == code


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_death_by_signal_is_128_plus_n(tmp_path: Path, run_dir: Path, sig: int) -> None:
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--", sys.executable, "-c",
                        f"import os; os.kill(os.getpid(), {int(sig)})"], tmp_path)  # fmt: skip
    assert res.returncode == 128 + sig
    # a failed job leaves a bundle and says where
    assert len(bundles(run_dir)) == 1 and b"evidence bundle:" in res.stderr


def test_output_unchanged_byte_for_byte(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a job's output when run directly
    direct = subprocess.run([sys.executable, str(PROGRAMS / "printer.py")], capture_output=True, env=job_env())
    # WHEN it runs under blackbox
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--", sys.executable, str(PROGRAMS / "printer.py")],
                       tmp_path)  # fmt: skip
    # THEN stdout and stderr are the same bytes, blackbox adds nothing, and console.log has it all
    assert res.returncode == 0
    assert res.stdout == direct.stdout and res.stderr == direct.stderr
    console = (run_dir / "console.log").read_bytes()
    header, _, body = console.partition(b"# ---\n")
    assert b"# host: " in header and b"# command: " in header and b"# git: " in header and b"# gpus: " in header
    assert sorted(body) == sorted(direct.stdout + direct.stderr)
    assert bundles(run_dir) == []
    assert oct(run_dir.stat().st_mode & 0o777) == "0o700"
    assert oct((run_dir / "console.log").stat().st_mode & 0o777) == "0o600"


# --- torchrun ---------------------------------------------------------------------------------------------
def gloo_cmd(tmp_path: Path, *args: str) -> list[str]:
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    return [TORCHRUN, "--nproc-per-node", "2", "--standalone", GLOO_JOB, "--marker-dir", str(markers),
            *args]  # fmt: skip


def test_sigterm_is_passed_on_to_torchrun_after_the_evidence_within_the_grace_budget(
    tmp_path: Path, run_dir: Path
) -> None:
    # GIVEN a 2-rank job that is stepping, in a Kubernetes pod (its environment says so), a grace budget of 3 s
    proc = start_blackbox(["run", "--run-dir", str(run_dir), "--grace-budget", "3", "--",
                           *gloo_cmd(tmp_path, "--steps", "100000", "--step-sleep", "0.02")], tmp_path,
                          KUBERNETES_SERVICE_HOST="10.96.0.1")  # fmt: skip
    wait_for(lambda: (tmp_path / "markers" / "rank1.step3").exists(), 60, "rank 1 to step")
    ranks = heartbeat_pids(run_dir)
    # WHEN blackbox gets SIGTERM (the kubelet's, as the pod is deleted)
    send(proc, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    # THEN torchrun got it, tore the ranks down, and its own exit code came back
    assert proc.returncode not in (0, 86), err
    forwarded = events(run_dir, "signal")
    assert forwarded and forwarded[0]["signal"] == "SIGTERM" and "forwarded" in str(forwarded[0]["action"])
    assert not any(is_alive(pid) for pid in ranks.values())
    assert b"got signal: 15" in err  # torchrun's own words: it received the signal
    # AND first the ranks' state before the teardown, collected within the grace budget, then the signal passed on
    (bundle,) = bundles(run_dir)
    with tarfile.open(bundle) as tar:
        manifest = tar.extractfile("manifest.json")
        assert manifest is not None
        collection = json.load(manifest)["collection"]
    assert collection["budget_s"] == 3 and collection["duration_s"] <= 4.5, collection  # (the bundle's writing after)
    (preemption,) = events(run_dir, "preemption")
    assert (preemption["signal"], preemption["grace_budget_s"]) == ("SIGTERM", 3)
    assert preemption["cause"] == "the pod is being deleted, preempted or drained (Kubernetes)"
    # passed on once the bundle is written: its analysis (the verdict under its path) comes after, as the job ends
    assert 0 <= float(forwarded[0]["t"]) - float(preemption["t"]) <= 5.0  # type: ignore[arg-type]
    assert err.index(b"then passed on to the job; recorded as a preemption") < err.index(b"  verdict: "), err
    # AND recorded as a preemption: no incident, no verdict line of a crash after it
    assert b"then passed on to the job; recorded as a preemption, not an incident" in err, err
    crashes = [e for e in events(run_dir) if e["event"] in ("rank_death", "exception") and not e.get("expected")]
    assert not crashes and not events(run_dir, "verdict")[1:], err


def test_sigusr1_collects_and_the_job_goes_on(tmp_path: Path, run_dir: Path) -> None:
    proc = start_blackbox(["run", "--run-dir", str(run_dir), "--",
                           *gloo_cmd(tmp_path, "--steps", "150", "--step-sleep", "0.05")], tmp_path)  # fmt: skip
    wait_for(lambda: (tmp_path / "markers" / "rank0.step2").exists(), 60, "rank 0 to step")
    send(proc, signal.SIGUSR1)
    wait_for(lambda: bundles(run_dir), 30, "the manual bundle")
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err  # torchrun never saw SIGUSR1, which would have killed it
    assert (tmp_path / "markers" / "rank1.step150").exists()
    (bundle,) = bundles(run_dir)
    assert bundle.name.endswith("-manual.tar.gz")
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert names[0] == "manifest.json" and "node/ranks.jsonl" in names  # the manifest first; the ranks' records
    assert {"ranks/0/heartbeat.json", "ranks/1/heartbeat.json"} <= set(read_bundle(str(bundle)).files)


def test_launcher_killed_orphans_are_ended(tmp_path: Path, run_dir: Path) -> None:
    proc = start_blackbox(["run", "--run-dir", str(run_dir), "--kill-grace", "5", "--",
                           *gloo_cmd(tmp_path, "--steps", "100000", "--step-sleep", "0.02")], tmp_path)  # fmt: skip
    wait_for(lambda: (tmp_path / "markers" / "rank1.step2").exists(), 60, "rank 1 to step")
    ranks = heartbeat_pids(run_dir)
    launcher = int(events(run_dir, "launched")[0]["pid"])  # type: ignore[call-overload]
    os.kill(launcher, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGKILL
    assert b"died of signal 9 (SIGKILL)" in err and b"left behind" in err
    assert not any(is_alive(pid) for pid in ranks.values())


def test_second_sigint_escalates(tmp_path: Path, run_dir: Path) -> None:
    ready = tmp_path / "ready"
    proc = start_blackbox(["run", "--run-dir", str(run_dir), "--kill-grace", "5", "--",
                           sys.executable, str(PROGRAMS / "ignore_sigint.py"), str(ready)], tmp_path)  # fmt: skip
    wait_for(ready.exists, 30, "the job to start")
    send(proc, signal.SIGINT)  # passed on, and ignored by the job
    wait_for(lambda: events(run_dir, "signal"), 10, "the first SIGINT to be forwarded")
    assert proc.poll() is None
    send(proc, signal.SIGINT)  # escalates: blackbox ends the job
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert b"ending the job (a second SIGINT)" in err


def test_recorder_in_ranks_only(tmp_path: Path, run_dir: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    for context in ("fork", "spawn"):
        rd = run_dir.with_name(f"run-{context}")
        res = run_blackbox(["run", "--run-dir", str(rd), "--", TORCHRUN, "--nproc-per-node", "2", "--standalone",
                            str(PROGRAMS / "loader_job.py"), str(reports), context], tmp_path)  # fmt: skip
        assert res.returncode == 0, res.stderr
        found = [json.loads(p.read_text()) for p in reports.glob("*.json")]
        ranks = {r["pid"] for r in found if r["kind"] == "rank"}
        workers = {r["pid"] for r in found if r["kind"] == "worker"}
        assert len(ranks) == 2 and len(workers) >= 2
        assert all(r["active"] for r in found if r["kind"] == "rank")
        assert not any(r["active"] for r in found if r["kind"] == "worker"), context
        # exactly the two ranks have heartbeats: not the agent, not the loader workers
        assert set(heartbeat_pids(rd).values()) == ranks
        launcher = int(events(rd, "launched")[0]["pid"])  # type: ignore[call-overload]
        assert launcher not in ranks
        for p in reports.glob("*.json"):
            p.unlink()


# --- stalls ---------------------------------------------------------------------------------------------
@pytest.mark.gallery("skip-allreduce")
def test_stall_is_caught_blamed_and_ended(gallery: Callable[[str], tuple[Path, Any]]) -> None:
    # GIVEN the gallery's 2-rank job whose rank 1 never enters an all_reduce while rank 0 waits in it (its row runs
    # with --stall-timeout 4 --poll-interval 0.5 --kill-grace 3)
    timeout, poll = 4.0, 0.5
    run_dir, res = gallery("skip-allreduce")
    # THEN blackbox ended the job with its own code, named rank 1 alone, and bundled the evidence
    assert res.exit_code == 86, res.stderr
    (stall,) = events(run_dir, "stall")
    assert stall["ranks"] == [0, 1]  # the rule says who stalled; the blame comes from the evidence
    idle = {f["rank"]: f["idle_s"] for f in stall["findings"]}  # type: ignore[union-attr, index]
    assert idle[1] <= timeout + 2 * poll
    (verdict,) = events(run_dir, "verdict")
    assert verdict["suspect_ranks"] == [1] and verdict["category"] == "hang.compute"
    err = res.stderr
    assert "stall: ranks 0-1 made no progress" in err and "while rank 0 waits for it in all_reduce #" in err
    assert "evidence bundle:" in err and "exit code will be 86" in err
    assert "verdict: hang.compute, suspect rank(s) 1" in err  # the report's one-screen verdict, under the path
    (bundle,) = bundles(run_dir)
    with tarfile.open(bundle) as tar:
        detection = json.load(tar.extractfile("detection.json"))  # type: ignore[arg-type]
        assert detection["ranks"] == [0, 1] and "suspects" not in detection
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert manifest["schema_version"] == 2 and manifest["trigger"] == "stall"
    assert manifest["triggered_by"] == {"rule": "stall", "kind": None, "remote": False}
    assert {f["path"] for f in manifest["files"]} >= {"node/ranks.jsonl", "console-tail.log", "events.jsonl"}
    assert {"ranks/0/heartbeat.json", "ranks/1/heartbeat.json"} <= set(read_bundle(str(bundle)).files)
    assert not any(is_alive(pid) for pid in heartbeat_pids(run_dir).values())


def test_on_stall_keep_leaves_the_job_running(tmp_path: Path, run_dir: Path) -> None:
    proc = start_blackbox(["run", "--run-dir", str(run_dir), "--stall-timeout", "2", "--poll-interval", "0.5",
                           "--on-stall", "keep", "--",
                           *gloo_cmd(tmp_path, "--steps", "100000", "--misbehave-rank", "1", "--at-step", "3")],
                          tmp_path)  # fmt: skip
    wait_for(lambda: events(run_dir, "stall"), 60, "the stall to be detected")
    wait_for(lambda: bundles(run_dir), 10, "the stall bundle")
    time.sleep(1.5)  # three polls: long enough for a kill to have been sent, were one coming
    assert proc.poll() is None
    assert all(is_alive(pid) for pid in heartbeat_pids(run_dir).values())
    send(proc, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert b"leaving the job running (--on-stall keep)" in err
    # one incident: the stall, once. A stall seen again while the SIGTERM ends the job (the preemption's dump moves
    # the ranks, then they are still again) is recorded as that ending (expected), never a second incident
    stalls = events(run_dir, "stall")
    assert [e for e in stalls if not e.get("expected")] == stalls[:1]
    assert all(e.get("preempted") for e in stalls[1:])


def test_a_launcher_that_fails_before_starting_anything_is_quoted_in_one_line(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN torchrun given an option it does not know: it exits 2 before it starts any process
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--", TORCHRUN, "--nproc-per-node", "2", "--bogus-flag",
                        "train.py"], tmp_path)  # fmt: skip
    # THEN its exit code passes through, its own words reach the terminal, and blackbox quotes its last line once,
    # with no bundle: there is no rank to read (a bundle of nothing said "hang.unknown" and matched other runs)
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert "torchrun: error: unrecognized arguments: --bogus-flag" in err
    said = [line for line in err.splitlines() if line.startswith("blackbox:")]
    expected = (
        "blackbox: the launcher exited with code 2 before any rank started, its last line: torchrun: error: "
        "unrecognized arguments: --bogus-flag (no bundle: there is no rank to read)"
    )
    assert said == [expected], err
    assert not bundles(run_dir)
    assert [e["exit_code"] for e in events(run_dir, "launcher_failed")] == [2]


# --- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "code", "sentence"),
    [
        (["run"], 2, "No command given"),
        (["run", "--"], 2, "No command given"),
        (
            ["run", "--", "no-such-command-xyz"],
            127,
            "The command `no-such-command-xyz` was not found on PATH.",
        ),
        (["run", "--", "/no/such/file"], 127, "does not exist"),
        (["run", "--stall-timeout", "soon", "--", "true"], 2, "`--stall-timeout` must be a number"),
        (["run", "--config", "/no/such.toml", "--", "true"], 2, "does not exist"),
    ],
)
def test_bad_input_is_one_sentence(tmp_path: Path, args: list[str], code: int, sentence: str) -> None:
    res = run_blackbox(args, tmp_path)
    err = res.stderr.decode()
    assert res.returncode == code
    assert sentence in err and "Traceback" not in err
    assert err.startswith("blackbox: error: ")


def test_unwritable_run_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = run_blackbox(["run", "--run-dir", str(blocker / "run"), "--", "true"], tmp_path)
    err = res.stderr.decode()
    assert res.returncode == 73 and "Cannot use" in err and "Traceback" not in err


@pytest.mark.parametrize("run_dir_given", [False, True], ids=["default-run-dir", "relative-run-dir"])
def test_a_removed_working_directory_is_one_sentence(tmp_path: Path, run_dir_given: bool) -> None:
    # GIVEN a shell standing in a directory that was removed under it (a scratch directory a script cleaned up)
    gone = tmp_path / "gone"
    gone.mkdir()
    flags = ["--run-dir", "run"] if run_dir_given else []
    script = f'cd "{gone}" && rmdir "{gone}" && exec "$@"'
    # WHEN blackbox run starts there
    res = subprocess.run(["sh", "-c", script, "sh", *BLACKBOX, "run", *flags, "--", "true"], env=job_env(),
                         capture_output=True, timeout=60)  # fmt: skip
    # THEN one sentence says so and what to do, no "internal error", no traceback
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert err.startswith("blackbox: error: The working directory of `blackbox run` no longer exists"), err
    assert "`cd` to a directory that exists" in err and "internal error" not in err and "Traceback" not in err


def test_run_dir_with_a_run_in_it_is_refused(tmp_path: Path, run_dir: Path) -> None:
    assert run_blackbox(["run", "--run-dir", str(run_dir), "--", "true"], tmp_path).returncode == 0
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--", "true"], tmp_path)
    assert res.returncode == 2 and b"already holds a run" in res.stderr


def test_secrets_printed_by_the_job_stay_off_disk(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a job that prints a token and fails (so a bundle is written too)
    token = "hf_" + "Q" * 34
    code = f"import sys; print('logging in with {token}'); sys.stdout.flush(); sys.exit(3)"
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--", sys.executable, "-c", code, "--api-key=sk-x"], tmp_path)
    # THEN the terminal sees what the job printed, but nothing blackbox wrote holds the secrets
    assert res.returncode == 3 and token.encode() in res.stdout
    assert token.encode() not in (run_dir / "console.log").read_bytes()
    assert b"sk-x" not in (run_dir / "console.log").read_bytes()
    assert b"<redacted>" in (run_dir / "console.log").read_bytes()
    (bundle,) = bundles(run_dir)
    with tarfile.open(bundle) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
            assert token.encode() not in data and b"sk-x" not in data, member.name


# --- launchers ------------------------------------------------------------------------------------------
def test_ranks_started_by_torch_multiprocessing_spawn_are_found(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a job that starts its 2 ranks with mp.spawn and sets the rank in code (no RANK in any environment)
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--stall-timeout", "4", "--poll-interval", "0.5",
                        "--kill-grace", "5", "--", sys.executable, str(PROGRAMS / "spawn_job.py"), "--hang-rank", "1"],
                       tmp_path)  # fmt: skip
    # THEN each spawned rank records as itself once it joined the process group, the parent steps aside, and
    # the stall names rank 1
    assert res.returncode == 86, res.stderr
    (stall,) = events(run_dir, "stall")
    assert stall["ranks"] == [0, 1] and events(run_dir, "verdict")[0]["suspect_ranks"] == [1]
    launcher = int(events(run_dir, "launched")[0]["pid"])  # type: ignore[call-overload]
    pids = heartbeat_pids(run_dir)
    assert sorted(pids) == [0, 1] and launcher not in pids.values()
    stepped = (run_dir / "ranks" / "0" / "recorder-events.jsonl").read_text()
    assert '"what": "stepped_aside"' in stepped


def test_torchrun_with_rank_in_its_own_environment_is_the_launcher(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a torchrun that an outer launcher or a job template started with RANK and LOCAL_RANK set, whose
    # rank 1 stops stepping at step 4
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--stall-timeout", "3", "--poll-interval", "0.5",
                        "--kill-grace", "5", "--",
                        *gloo_cmd(tmp_path, "--steps", "100000", "--misbehave-rank", "1", "--at-step", "4")],
                       tmp_path, RANK="0", LOCAL_RANK="0")  # fmt: skip
    # THEN torchrun is still the launcher (no recorder, no heartbeat), the two ranks are watched, and the
    # stall names rank 1 as it does without those variables
    assert res.returncode == 86, res.stderr
    launcher = int(events(run_dir, "launched")[0]["pid"])  # type: ignore[call-overload]
    pids = heartbeat_pids(run_dir)
    assert sorted(pids) == [0, 1] and launcher not in pids.values()
    assert events(run_dir, "verdict")[0]["suspect_ranks"] == [1]


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="unshare --pid needs root")
def test_ranks_in_another_pid_namespace_are_said_unwatchable_never_dead(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a job whose ranks live in a PID namespace of their own (as in a container with its own PID space)
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--stall-timeout", "3", "--poll-interval", "0.5", "--",
                        "unshare", "--pid", "--fork", "--mount-proc", *gloo_cmd(tmp_path, "--steps", "20")],
                       tmp_path)  # fmt: skip
    # THEN blackbox says once per rank that it cannot watch it, and no rank is taken for dead: exit 0, no bundle
    assert res.returncode == 0, res.stderr
    assert sorted(e["rank"] for e in events(run_dir, "rank_unwatchable")) == [0, 1]  # type: ignore[type-var]
    assert res.stderr.decode().count("runs in another PID namespace") == 2
    assert not bundles(run_dir) and not events(run_dir, "stall")


def test_ctrl_c_at_the_terminal_is_the_users_decision_not_a_crash(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN an interactive run (blackbox on a terminal, as a user's shell starts it) of a 2-rank DDP job
    import fcntl
    import termios

    master, slave = os.openpty()
    train = Path(__file__).resolve().parents[2] / "scripts" / "scenarios" / "train.py"
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [sys.executable, "-m", "blackbox", "run", "--run-dir", str(run_dir), "--", TORCHRUN, "--standalone",
         "--nproc-per-node", "2", str(train), "data-hang", "1", "ddp"],
        cwd=tmp_path, env=job_env(BB_FAIL_WHEN=str(tmp_path / "never"), BLACKBOX_HOME=str(home)),
        stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )  # fmt: skip
    os.close(slave)
    out = bytearray()

    def drain() -> bytes:
        with __import__("contextlib").suppress(OSError):
            while __import__("select").select([master], [], [], 0.05)[0]:
                chunk = os.read(master, 65536)
                if not chunk:
                    break
                out.extend(chunk)
        return bytes(out)

    try:
        wait_for(lambda: drain() is not None and len(events(run_dir, "first_step")) == 2, 90, "both ranks to step")
        # WHEN the user presses Ctrl-C
        os.write(master, b"\x03")
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            drain()
        drain()
        assert proc.returncode is not None, bytes(out)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = bytes(out).decode("utf-8", "replace")
    # THEN one line says so, the job's own exit code is kept, and there is no bundle, no verdict, no incident
    assert "interrupted (Ctrl-C)" in text, text[-3000:]
    assert "verdict:" not in text and "evidence bundle" not in text, text[-3000:]
    assert not bundles(run_dir)
    end = events(run_dir, "end")[-1]
    assert end["exit_code"] == end["job_exit_code"] == proc.returncode != 0
    assert not (home / "incidents.sqlite").exists() or "KeyboardInterrupt" not in (
        home / "incidents.sqlite"
    ).read_bytes().decode("latin-1")


def test_repeated_sigints_act_at_once_even_during_a_collection(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a collection in progress that waits up to 60 s for py-spy, which does not return (as it may not on a
    # process in uninterruptible sleep), of a job whose rank 1 is stopped
    train = Path(__file__).resolve().parents[2] / "scripts" / "scenarios" / "train.py"
    stuck = tmp_path / "py-spy"
    stuck.write_text("#!/bin/sh\nsleep 300\n")
    stuck.chmod(0o755)
    proc = start_blackbox(["run", "--run-dir", str(run_dir), "--dump-timeout", "60", "--kill-grace", "3", "--",
                           TORCHRUN, "--standalone", "--nproc-per-node", "2", str(train), "stopped", "1", "ddp"],
                          tmp_path, BLACKBOX_PYSPY=str(stuck))  # fmt: skip
    wait_for(lambda: len(events(run_dir, "first_step")) == 2, 90, "both ranks to step")
    pid = heartbeat_pids(run_dir)[1]
    wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 60, "rank 1 to stop")
    send(proc, signal.SIGUSR1)  # "collect now": py-spy's 60 s wait begins
    wait_for(lambda: events(run_dir, "signal"), 10, "the collection to begin")
    time.sleep(2.0)
    # WHEN the user interrupts, again, and again
    started = time.monotonic()
    for _ in range(3):
        send(proc, signal.SIGINT)
        time.sleep(0.3)
    proc.communicate(timeout=120)
    # THEN the job was ended and killed at once, not after the collection's 60 s wait
    assert time.monotonic() - started < 30
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    end = events(run_dir, "end")[-1]
    assert end["job_exit_code"] != 0
