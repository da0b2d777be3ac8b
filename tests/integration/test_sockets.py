"""A rank's socket bytes are motion (supervisor.netwatch): an upload over plain HTTP — s3fs to a real S3 server
(SeaweedFS) through a slow link, sent with send(), which /proc/PID/io does not count — keeps a rank alive exactly as
file bytes do, from a thread while the main thread waits for it and from a non-daemon thread at interpreter exit;
the same upload to a peer that takes nothing is a stall. Real torchrun on gloo, a short --stall-timeout (the rule,
not the default, is under test)."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle
from tests.conftest import BLACKBOX, PROGRAMS, TORCHRUN, bundles, job_env, kill_tree
from tests.integration.services import BUCKET, S3Server, s3local, seaweed_s3

JOB = PROGRAMS / "upload_job.py"
RATE = 160_000  # bytes a second through the slow link: 6 MiB take about 40 s, four stall timeouts
STALL_S = 10


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweed_s3(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


def run(mode: str, s3: S3Server, rate: int, tmp_path: Path) -> tuple[int, str, str]:
    host, port = s3.endpoint.rsplit("/", 1)[-1].split(":")
    link = s3local.Link((host, int(port)), rate)
    cmd = [*BLACKBOX, "run", "--run-dir", str(tmp_path / "run"), "--stall-timeout", str(STALL_S), "--kill-grace",
           "3", "--", TORCHRUN, "--standalone", "--nproc-per-node", "2", str(JOB), mode]  # fmt: skip
    env = job_env(**s3.env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{link.port}"),
                  BB_UPLOAD_KEY=f"{BUCKET}/{tmp_path.name}/ckpt.pt")  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=200)
    finally:
        kill_tree(proc)
        link.close()
    return proc.returncode, out, err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["thread", "exit"])
@pytest.mark.long
def test_an_upload_over_plain_http_through_a_slow_link_is_work(s3: S3Server, tmp_path: Path, mode: str) -> None:
    # GIVEN rank 0 uploading 6 MiB with s3fs through a 160 kB/s link (about 40 s), from a thread its main thread
    # waits for, or from a non-daemon thread as the interpreter exits, while rank 1 waits or has exited
    started = time.monotonic()
    code, out, err = run(mode, s3, RATE, tmp_path)
    # THEN the job runs to its end: four stall timeouts of an upload whose bytes only the socket counts end nothing
    assert code == 0, err[-3000:]
    assert "rank 0: uploaded 6291456 bytes" in out, out[-2000:]
    assert time.monotonic() - started > 3 * STALL_S, "the link was not slow: the rule was not under test"
    assert not bundles(tmp_path / "run"), err[-3000:]
    # AND the pause is said for what it is, once rank 0 has been still for the timeout: its bytes on the socket
    assert re.search(r"slow phase: rank 0 has taken no step for \d+ s and still works; rank 0: \w+: moves bytes over "
                     r"TCP with 127\.0\.0\.1:\d+: [\d.]+ kB/s", err), err[-3000:]  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["thread", "exit"])
def test_an_upload_to_a_peer_that_takes_nothing_is_a_stall(s3: S3Server, tmp_path: Path, mode: str) -> None:
    # GIVEN the same upload through a link that accepts the connection and then takes nothing
    code, out, err = run(mode, s3, 0, tmp_path)
    # THEN once the socket's buffers are full nothing moves: ended as a stall, rank 0 named; at exit, with the exit
    # code that says training had finished (87: not to be run again), not the one a Slurm script requeues (86)
    assert code == (86 if mode == "thread" else 87), err[-3000:]
    assert "uploaded" not in out
    (bundle,) = bundles(tmp_path / "run")
    report = analyze(read_bundle(str(bundle))).to_json()
    verdict = report["verdict"]
    assert verdict["suspect_ranks"] == [0], verdict
    stages = {r["rank"]: r["stage"] for r in report["ranks"]}
    assert stages == ({0: "training", 1: "training"} if mode == "thread" else {0: "exiting", 1: "exited"}), stages
    if mode == "exit":
        # AND at exit, with rank 1 gone in peace, the rank that cannot exit is the hang, and what holds it is said:
        # botocore's thread waits to send (in poll), the bytes its peer did not take sit in the socket's queue
        assert verdict["category"] == "hang.io", verdict
        assert re.search(r"rank 0 is waiting for I/O \(finished but cannot exit: the interpreter waits for a thread "
                         r"of its own, whose socket to 127\.0\.0\.1:\d+ holds [\d.]+ [kM]B that the peer has not "
                         r"taken\)", verdict["summary"]), verdict  # fmt: skip
    # (with s3fs the thread is its event loop's, in epoll_wait for the answer to a request's headers: which socket
    # it waits on is not read yet, and the verdict names the rank, not the socket: docs/limits.md)
