"""Facts about this node and the job's working tree: hostname, IP addresses, git state, package versions.
May import the stdlib and psutil. Every probe is bounded in time and never raises."""

from __future__ import annotations

import importlib.metadata
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Optional

import psutil


def hostname() -> str:
    return socket.gethostname()


def ip_addresses() -> list[str]:
    """Non-loopback IPv4 and IPv6 addresses of this node."""
    addrs: list[str] = []
    try:
        for name, entries in sorted(psutil.net_if_addrs().items()):
            if name == "lo":
                continue
            for entry in entries:
                if entry.family in (socket.AF_INET, socket.AF_INET6) and not entry.address.startswith(
                    ("127.", "::1", "fe80")
                ):
                    addrs.append(entry.address.split("%")[0])
    except (OSError, psutil.Error):
        pass
    return addrs


@dataclass(frozen=True)
class GitState:
    commit: Optional[str]
    branch: Optional[str]
    dirty: Optional[bool]

    def describe(self) -> str:
        if self.commit is None:
            return "not a git work tree"
        dirty = {True: " (dirty)", False: "", None: " (dirty state unknown)"}[self.dirty]
        return f"{self.commit[:12]}{' on ' + self.branch if self.branch else ''}{dirty}"


def _git(cwd: str, *args: str, timeout: float) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(cwd: str, timeout: float = 3.0) -> GitState:
    if shutil.which("git") is None:
        return GitState(None, None, None)
    commit = _git(cwd, "rev-parse", "HEAD", timeout=timeout)
    if commit is None:
        return GitState(None, None, None)
    branch = _git(cwd, "rev-parse", "--abbrev-ref", "HEAD", timeout=timeout)
    status = _git(cwd, "status", "--porcelain", "--untracked-files=no", timeout=timeout)
    return GitState(commit, branch, None if status is None else bool(status))


def package_version(name: str) -> Optional[str]:
    """The installed version, read from metadata: never imports the package (torch takes seconds)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
