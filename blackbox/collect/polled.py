"""What a rank's poll loop checks, read once at collection: the loop's `while` line (from the rank's own source) and
the strings its frames hold that name what it waits for — a lock file, a marker, a store key — with whether the file
exists and who holds it open. Only those strings leave the process, redacted. Imports the stdlib, blackbox's
adapters and redaction."""

from __future__ import annotations

import os
import re
import stat
from itertools import islice
from typing import Any, Optional

from ..adapters import procfs, proctree
from ..adapters.stacks import Frame
from ..redact import redact_argv, redact_named, redact_text

MAX_FRAMES = 6  # the loop's frames looked at: the innermost Python frames, up to the first of the user's own
MAX_CHECKS = 4
MAX_VALUE = 1024  # a longer string is not a name of something to wait for
LOOP_LINES = 15  # how far above a frame's line its `while` is looked for
MAX_SOURCE = 8 * 1024 * 1024
_WHILE = re.compile(r"^\s*while\s+(.+?):?\s*(#.*)?$")
_FOREVER = re.compile(r"^\s*while\s+\(?\s*(True|1)\s*\)?\s*:")
_DEF = re.compile(r"^\s*(async\s+def|def|class)\s")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def checks(pid: int, threads: Any) -> Optional[dict[str, Any]]:
    """From py-spy's JSON of `pid` taken with --locals (frames innermost first): the loop's line and what it checks,
    as proc.json's `polls` record; None when its main thread shows no Python frame."""
    frames = _loop_frames(threads)
    if not frames:
        return None
    loop: Optional[dict[str, str]] = None
    out: list[dict[str, Any]] = []
    for f in frames:
        frame = Frame(str(f["filename"]), f["line"] if isinstance(f.get("line"), int) else 0, _short(f["name"]))
        line = _while_line(pid, frame.file, frame.line) if loop is None else None
        if line is not None:
            loop = {"frame": frame.describe(), "line": redact_text(line.strip())[:200]}
        named = set(_NAME.findall(line)) if line else set()
        for local in f.get("locals") or []:
            value = _string(local)
            name = str(local.get("name", "")) if isinstance(local, dict) else ""
            if value is None or len(out) >= MAX_CHECKS or any(c["value"] == value for c in out):
                continue
            where = _in_view(pid, value)
            # what its loop's line names; in a frame without one, a path to a file (not a folder: a job's workdir)
            if name in named or (not named and where is not None and not os.path.isdir(where)):
                out.append(_check(pid, name, value, frame, where))
    return {"loop": loop, "checks": out} if loop is not None or out else None


def _loop_frames(threads: Any) -> list[dict[str, Any]]:
    """The main thread's Python frames, innermost first, up to and including the first of the user's own."""
    ts = [t for t in threads if isinstance(t, dict)] if isinstance(threads, list) else []
    main = next((t for t in ts if t.get("thread_name") == "MainThread"), ts[0] if ts else None)
    out = []
    for f in (main or {}).get("frames") or []:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str) or not isinstance(f.get("name"), str):
            continue
        if f.get("module"):  # a native frame
            continue
        out.append(f)
        if len(out) >= MAX_FRAMES or not Frame(f["filename"], 0, "").is_library:
            break
    return out


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _string(local: Any) -> Optional[str]:
    """A local's value when it is a string (py-spy's repr of one, quoted), else None."""
    r = local.get("repr") if isinstance(local, dict) else None
    if not isinstance(r, str) or len(r) < 2 or r[0] not in "\"'" or r[-1] != r[0] or len(r) > MAX_VALUE + 2:
        return None
    value = r[1:-1]
    return value if value and "\n" not in value and "\\n" not in value else None


def _in_view(pid: int, value: str) -> Optional[str]:
    """Where a string names a path in the rank's view of the files (its root, its working directory) whose folder
    exists; None when it is no such path."""
    if "/" not in value or "://" in value or any(c.isspace() for c in value):
        return None
    base = f"/proc/{pid}/root" if value.startswith("/") else f"/proc/{pid}/cwd"
    path = os.path.join(base, value.lstrip("/"))
    return path if os.path.isdir(os.path.dirname(path)) else None


def _check(pid: int, name: str, value: str, frame: Frame, where: Optional[str]) -> dict[str, Any]:
    """One string a loop holds, redacted, and for a path whether it exists and who holds it open."""
    shown = redact_named(name, value)
    out: dict[str, Any] = {"name": name, "value": shown, "frame": frame.describe()}
    if where is None or shown != value:
        return out
    try:
        st = os.stat(where)
    except OSError:
        out["exists"] = False
        return out
    out["exists"] = True
    held = [p for p in proctree.holders(st.st_dev, st.st_ino, os.path.basename(value)) if p != pid]
    out["held_by"] = [{"pid": p, "argv": redact_argv(procfs.cmdline(p))[:8]} for p in held]
    return out


def _while_line(pid: int, file: str, line: int) -> Optional[str]:
    """The `while` that encloses `line` of the rank's source file (not a bare `while True:`), read through the
    rank's own view of the files and only where its user may read it; None where there is none."""
    if line <= 0 or not file.endswith(".py"):
        return None
    lines = _source(pid, file, line)
    if len(lines) < line:
        return None
    if _WHILE.match(lines[-1]):  # caught in the check itself
        return None if _FOREVER.match(lines[-1]) else lines[-1]
    inner = _indent(lines[-1])
    for text in reversed(lines[-LOOP_LINES:-1]):
        if not text.strip() or text.lstrip().startswith("#") or _indent(text) >= inner:
            continue
        inner = _indent(text)  # a header of a block around the line
        if _WHILE.match(text):
            return None if _FOREVER.match(text) else text
        if _DEF.match(text):
            return None
    return None


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def _source(pid: int, file: str, line: int) -> list[str]:
    base = f"/proc/{pid}/root" if file.startswith("/") else f"/proc/{pid}/cwd"
    try:
        fd = os.open(os.path.join(base, file.lstrip("/")), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as f:
        st = os.fstat(fd)
        owner = procfs.uid(pid)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SOURCE or not (
                st.st_mode & stat.S_IROTH or st.st_uid == owner):  # fmt: skip
            return []
        try:
            return list(islice(f, line))
        except (OSError, ValueError):
            return []
