"""Raising the alarm: `--on-incident` runs once per bundle with the verdict in its environment, apart from the job,
`--notify-url` POSTs one JSON per incident to a real local HTTP server, and neither a failing command nor an
unreachable URL changes the job's exit code. The periodic status line shows each rank and (through the fake GPU
adapter) each GPU's temperature and utilisation."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from blackbox.events import read_events
from tests.conftest import (
    BLACKBOX,
    PROGRAMS,
    TORCHRUN,
    bundles,
    job_env,
    kill_tree,
    run_blackbox,
    start_blackbox,
    wait_for,
)
from tests.integration.test_run import heartbeat_pids
from tests.ports import free_port

GLOO_JOB = str(PROGRAMS / "gloo_job.py")
STALL = ["--stall-timeout", "3", "--poll-interval", "0.5", "--kill-grace", "5"]


def stalling_job(tmp_path: Path) -> list[str]:
    return [TORCHRUN, "--standalone", "--nproc-per-node", "2", GLOO_JOB, "--steps", "100000", "--misbehave-rank",
            "1", "--at-step", "3", "--marker-dir", str(tmp_path)]  # fmt: skip


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_one_webhook_and_one_command_per_incident(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a local webhook and an on-incident command that records its environment, then runs on while blackbox ends
    # the job after the stall
    _Hook.received = []
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    seen, done = tmp_path / "incident.env", tmp_path / "done"
    cmd = f"env | grep ^BLACKBOX_ >> {seen}; sleep 4; echo finished > {done}; exit 7"
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"
        res = run_blackbox(["run", "--run-dir", str(run_dir), *STALL, "--on-incident", cmd, "--notify-url", url,
                            "--", *stalling_job(tmp_path)], tmp_path)  # fmt: skip
    finally:
        server.shutdown()
    # THEN the job's outcome is the stall's, one bundle, one POST with its verdict, one command run
    assert res.returncode == 86, res.stderr
    (bundle,) = bundles(run_dir)
    (post,) = _Hook.received
    assert post["bundle"] == str(bundle) and post["verdict"]["suspect_ranks"] == [1]
    assert post["verdict"]["category"] == "hang.compute" and post["run_id"] and post["host"]
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines())
    assert env["BLACKBOX_BUNDLE"] == str(bundle) and env["BLACKBOX_SUSPECTS"] == "1"
    assert env["BLACKBOX_CATEGORY"] == "hang.compute" and env["BLACKBOX_TRIGGER"] == "stall"
    # AND the command is not part of the job: neither killed with the job's processes nor reaped by blackbox's loop,
    # it finished, and its own exit code is the one recorded
    assert done.read_text() == "finished\n"
    (ran,) = [e for e in read_events(str(run_dir / "events.jsonl")) if e["event"] == "on_incident"]
    assert ran["exit_code"] == 7, ran


def test_failing_command_and_unreachable_url_leave_the_exit_code_alone(tmp_path: Path, run_dir: Path) -> None:
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--on-incident", "exit 7", "--notify-url",
                        "http://127.0.0.1:9/nobody-listens", "--", sys.executable, "-c", "import sys; sys.exit(3)"],
                       tmp_path)  # fmt: skip
    err = res.stderr.decode()
    assert res.returncode == 3, err
    assert "--on-incident command exit code 7; the job is not affected" in err
    assert "--notify-url could not be reached" in err and "Traceback" not in err


def test_status_line_shows_ranks_and_gpus(tmp_path: Path, run_dir: Path) -> None:
    fake = tmp_path / "gpus.json"
    fake.write_text(json.dumps([{"index": 0, "name": "H100", "temperature_c": 71, "utilization_pct": 99,
                                 "memory_used_mib": 1000, "memory_total_mib": 81559}]))  # fmt: skip
    # (torchrun as `python -m torch.distributed.run`: the launcher is found in that form too)
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--status-interval", "1", "--poll-interval", "0.25", "--",
                        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        GLOO_JOB, "--steps", "300", "--step-sleep", "0.02"], tmp_path,
                       BLACKBOX_FAKE_GPUS=str(fake))  # fmt: skip
    assert res.returncode == 0, res.stderr
    ranks = heartbeat_pids(run_dir)
    assert sorted(ranks) == [0, 1] and not bundles(run_dir)
    launcher = int(next(e for e in read_events(str(run_dir / "events.jsonl")) if e["event"] == "launched")["pid"])
    assert launcher not in ranks.values()
    lines = [line for line in res.stderr.decode().splitlines() if line.startswith("blackbox: status: ")]
    assert lines, res.stderr
    assert any("rank 0 step" in line and "rank 1 step" in line and "/s)" in line for line in lines), lines
    # each rank's GPU, from LOCAL_RANK (no CUDA_VISIBLE_DEVICES here, no NVML)
    assert any(re.search(r"rank 1 step \d+ \([\d.]+/s\) \w+ GPU1", line) for line in lines), lines
    assert all("GPU0 H100 71C util 99%" in line for line in lines)
    assert b"GPU0 H100 71C" in (run_dir / "console.log").read_bytes()  # the header says which GPU, how hot


# --- the GPU watch (through the fake GPU adapter) --------------------------------------------------------------
def gpu(util: float, temp: float = 40.0, throttle: str | None = None) -> dict[str, Any]:
    return {"index": 0, "name": "H100", "temperature_c": temp, "utilization_pct": util, "memory_used_mib": 5000,
            "memory_total_mib": 81559, "throttle": throttle, "slowdown_temp_c": 90.0}  # fmt: skip


def test_idle_gpus_trigger_when_no_rank_has_a_heartbeat(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN a job the recorder cannot see (a shell, no Python rank) while every GPU sits at 0 %
    fake = tmp_path / "gpus.json"
    fake.write_text(json.dumps([gpu(0.0)]))
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--gpu-idle-timeout", "2", "--poll-interval", "0.25",
                        "--kill-grace", "3", "--", "sh", "-c", "sleep 600"], tmp_path,
                       BLACKBOX_FAKE_GPUS=str(fake))  # fmt: skip
    # THEN blackbox collects on the GPU-idle rule alone and ends the job like a stall
    err = res.stderr.decode()
    assert res.returncode == 86, err
    assert "GPU idle: every GPU of the job has been at 0 % utilisation" in err
    (bundle,) = bundles(run_dir)
    assert "gpu-idle" in bundle.name
    rep = subprocess.run([*BLACKBOX, "report", str(bundle), "--format", "json"], capture_output=True, text=True,
                         env=job_env(), timeout=60)  # fmt: skip
    report = json.loads(rep.stdout)
    assert report["verdict"]["category"] == "hang.unknown"
    assert any("GPU 0 (H100): 0.0 % utilisation" in f["text"] and "at 0 % for the last" in f["text"]
               for f in report["findings"])  # fmt: skip


def test_a_launcher_waiting_in_its_rendezvous_for_another_node_is_no_hang(tmp_path: Path, run_dir: Path) -> None:
    # GIVEN node 0 of a two-node torchrun job whose other node never comes: its agent waits in its own rendezvous,
    # no rank started, every GPU at 0 % well past the GPU-idle timeout
    fake = tmp_path / "gpus.json"
    fake.write_text(json.dumps([gpu(0.0)]))
    argv = ["run", "--run-dir", str(run_dir), "--gpu-idle-timeout", "2", "--poll-interval", "0.25", "--coord", "off",
            "--", TORCHRUN, "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
            str(free_port()), "--nproc-per-node", "1", str(PROGRAMS / "quiet_job.py"), "save"]  # fmt: skip
    proc = start_blackbox(argv, tmp_path, BLACKBOX_FAKE_GPUS=str(fake))
    try:
        # THEN blackbox says once that the launcher waits in its rendezvous, and no rule fires: nothing collected,
        # the job not ended, 8 s past the GPU-idle timeout
        wait_for(lambda: (run_dir / "events.jsonl").exists() and any(
            e.get("event") == "launcher_waiting" for e in read_events(str(run_dir / "events.jsonl"))), 60,
            "the launcher's wait to be said")  # fmt: skip
        time.sleep(8)
        assert proc.poll() is None and not bundles(run_dir)
        events = read_events(str(run_dir / "events.jsonl"))
        (said,) = [e for e in events if e.get("event") == "launcher_waiting"]
        assert said["nnodes"] == "2" and said["pid"] > 0, said
        assert not [e for e in events if e.get("event") in ("stall", "bundle", "incident", "gpu_idle")], events
        # AND `blackbox status` says why no rank has a heartbeat, and for how long the launcher has waited
        out = subprocess.run([*BLACKBOX, "status", str(run_dir)], capture_output=True, text=True, env=job_env(),
                             timeout=60).stdout  # fmt: skip
        out = " ".join(out.split())  # as one line, whatever the width it was wrapped at
        assert re.search(rf"no rank has a heartbeat yet: the launcher \(torchrun, pid {said['pid']}\) has started no "
                         r"rank; it has waited in its own rendezvous for the job's other nodes \(--nnodes 2\) for "
                         r"\d+ s", out), out  # fmt: skip
    finally:
        kill_tree(proc)


def test_a_throttling_gpu_is_an_event_and_a_finding(tmp_path: Path, run_dir: Path) -> None:
    fake = tmp_path / "gpus.json"
    fake.write_text(json.dumps({"samples": [[gpu(95.0)], [gpu(97.0, 93.0, "hw_thermal")]]}))
    job = [sys.executable, "-c", "import time, sys; time.sleep(2); sys.exit(5)"]
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--poll-interval", "0.25", "--", *job], tmp_path,
                       BLACKBOX_FAKE_GPUS=str(fake))  # fmt: skip
    err = res.stderr.decode()
    assert res.returncode == 5, err
    assert "GPU 0 is throttling its clocks (hw_thermal)" in err and "GPU 0 is at 93C (slows down at 90C)" in err
    names = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert names.count("gpu_throttle") == 1 and names.count("gpu_hot") == 1
    (bundle,) = bundles(run_dir)  # the job failed: its exit bundle carries the GPU history
    rep = subprocess.run([*BLACKBOX, "report", str(bundle), "--format", "json"], capture_output=True, text=True,
                         env=job_env(), timeout=60)  # fmt: skip
    assert any("GPU 0 throttled its clocks (hw_thermal); hottest reading 93.0C" in f["text"]
               for f in json.loads(rep.stdout)["findings"])  # fmt: skip
