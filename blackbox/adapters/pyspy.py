"""py-spy: stacks of a process taken from outside (no signal, no help from the target), as JSON.
The one module that knows py-spy's command line, its JSON and its failure messages. Imports the stdlib and the
common stack shape (adapters.stacks)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Optional

from .stacks import Frame, ThreadStack

PTRACE_HINT = (
    "py-spy needs ptrace: run as the job's user with kernel.yama.ptrace_scope=0 "
    "(sudo sysctl kernel.yama.ptrace_scope=0), or in a container add --cap-add SYS_PTRACE"
)


@dataclass(frozen=True)
class PySpyResult:
    pid: int
    threads: Optional[list[dict[str, Any]]]  # py-spy's JSON: [{thread_id, thread_name, owns_gil, frames: [...]}]
    error: Optional[str]  # one sentence, with the fix where there is one
    refused: bool = False  # ptrace (or reading the process's memory) was refused: no CAP_SYS_PTRACE, seccomp, Yama
    timed_out: bool = False  # py-spy was ended at its time limit (a busy machine: it may finish given longer)


ENV_PYSPY = "BLACKBOX_PYSPY"  # the py-spy executable to use


def find() -> tuple[Optional[str], str]:
    """(executable, how it was found or why there is none): BLACKBOX_PYSPY, else PATH, else next to
    blackbox's own interpreter (a pipx install keeps it there, off PATH)."""
    given = os.environ.get(ENV_PYSPY)
    if given:
        if os.access(given, os.X_OK) and os.path.isfile(given):
            return given, f"{ENV_PYSPY}={given}"
        return None, f"{ENV_PYSPY}={given} is not an executable file"
    on_path = shutil.which("py-spy")
    if on_path:
        return on_path, "PATH"
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside, "blackbox's environment"
    return None, "py-spy is not installed: pip install py-spy (a dependency of torch-blackbox), or set " + ENV_PYSPY


def dump(pid: int, *, native: bool = False, locals: bool = False, timeout: float = 10.0, exe: Optional[str] = None,
         nonblocking: bool = False) -> PySpyResult:  # fmt: skip
    """`nonblocking`: read the process's memory without suspending it (py-spy cannot suspend a process that is
    already stopped: "Failed to suspend process"; a stopped process's memory holds still anyway)."""
    if exe is None:
        exe, why = find()
        if exe is None:
            return PySpyResult(pid, None, why)
    cmd = [exe, "dump", "--json", "--pid", str(pid), *(["--native"] if native else []),
           *(["--locals"] if locals else []), *(["--nonblocking"] if nonblocking else [])]  # fmt: skip
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return PySpyResult(pid, None, f"py-spy did not finish within {timeout:g} s", timed_out=True)
    except OSError as exc:
        return PySpyResult(pid, None, f"py-spy could not be run: {exc.strerror}")
    if out.returncode != 0:
        text = failure(out.stderr or out.stdout) or f"exit code {out.returncode}"
        refused = any(word in text.lower() for word in ("permission", "not permitted", "ptrace"))
        return PySpyResult(pid, None, f"py-spy failed: {text}" + (f" ({PTRACE_HINT})" if refused else ""), refused)
    try:
        threads = json.loads(out.stdout)
    except ValueError:
        return PySpyResult(pid, None, "py-spy printed something that is not JSON")
    return PySpyResult(pid, threads if isinstance(threads, list) else None, None)


REFUSED = "could not be suspended (ptrace refused)"  # said of the processes read without suspending them instead


def failure(output: str) -> str:
    """py-spy's failure in one line: its error and the innermost cause ("Failed to … : Permission denied (os error
    13)"), without the stack backtrace that RUST_BACKTRACE=1 adds."""
    lines = [line.strip() for line in output.split("Stack backtrace:", 1)[0].strip().splitlines() if line.strip()]
    error = next((line[len("Error:") :].strip() for line in lines if line.startswith("Error:")), "")
    causes = [re.sub(r"^\d+: ", "", line) for line in lines if re.match(r"^\d+: ", line)]
    if error and causes and causes[-1] not in error:
        return f"{error.rstrip('.')}: {causes[-1]}"
    return error or (lines[-1] if lines else "")


def threads(data: Any) -> list[ThreadStack]:
    """py-spy's JSON (a list of threads, frames innermost first) in the common stack shape (outermost first).
    Untrusted input: entries that do not fit are skipped."""
    out: list[ThreadStack] = []
    for t in data if isinstance(data, list) else []:
        if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
            continue
        frames = []
        for f in t["frames"]:
            if isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("filename"), str):
                line, module = f.get("line"), f.get("module")
                # a native frame keeps its C++ name whole (`c10d::ProcessGroupNCCL::WorkNCCL::wait`): only a
                # Python frame's qualified name (`Module.forward`) is cut to its function
                native = isinstance(module, str) and bool(module)
                name = f["name"] if native else f["name"].rsplit(".", 1)[-1]
                frames.append(Frame(f["filename"], line if isinstance(line, int) else 0, name,
                                    str(module) if native else ""))  # fmt: skip
        name = t.get("thread_name")
        out.append(ThreadStack(str(t.get("thread_id", "?")), name if isinstance(name, str) else None,
                               bool(t.get("owns_gil")), tuple(reversed(frames))))  # fmt: skip
    return out


_TEXT_THREAD = re.compile(r'^\s*Thread\s+(\S+)\s+\(([^)]*)\)(?::\s*"(.*)")?\s*$')
_TEXT_FRAME = re.compile(r"^\s+(.+?) \((.+?)(?::(\d+))?\)\s*$")


def parse_text(text: str) -> list[dict[str, Any]]:
    """`py-spy dump`'s text output (as users paste it into issues) in the shape of its JSON: threads with their
    frames innermost first. A frame without a line number whose file is not Python source (`libcudart.so.12`,
    `engine.cpp`) is a native frame (`--native`): its file is kept as its module. Locals and other lines are
    skipped; untrusted text gives what it can."""
    threads: list[dict[str, Any]] = []
    for raw in text.splitlines():
        m = _TEXT_THREAD.match(raw)
        if m:
            status = m.group(2)
            threads.append({"thread_id": m.group(1), "thread_name": m.group(3) or None, "owns_gil": "gil" in status,
                            "active": "active" in status, "frames": []})  # fmt: skip
            continue
        f = _TEXT_FRAME.match(raw)
        if f is None or not threads or raw.lstrip().startswith(("Arguments:", "Locals:")):
            continue
        name, file, line = f.group(1), f.group(2), f.group(3)
        native = line is None and not file.endswith(".py") and not file.startswith("<")
        threads[-1]["frames"].append({"name": name, "filename": file, "line": int(line) if line else 0,
                                      "module": file if native else None})  # fmt: skip
    return threads
