"""Builds the GPU corpus's bundles (tests/data/gpu_corpus/<case>.tar.gz) from its cases (tests/data/gpu_corpus/cases/
<case>.json): real NCCL hangs and crashes posted in public issue threads, each with the thread it came from, the
evidence as posted (console output, py-spy and faulthandler dumps, tracebacks, native backtraces) and the verdict
the thread's resolution states. The builder only changes the evidence's format, never its content: the console
text becomes the bundle's console tail; a py-spy text dump becomes the JSON py-spy writes (on each rank the poster
said it held for); a faulthandler dump, the rank's own dump; a traceback, the rank's exception record (as the
recorder writes it); an lldb or gdb backtrace, native frames. How `blackbox run` would have been triggered comes from
the case: `console` runs the supervisor's own fatal-line rule over the console text, `stall` and `exception` are the
rules' names. Run with the project's venv: python scripts/make_gpu_corpus.py [CASE...]"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from blackbox.adapters import pyspy  # noqa: E402
from blackbox.bundle.reader import Bundle  # noqa: E402
from blackbox.bundle.writer import BundleWriter  # noqa: E402
from blackbox.detections import Trigger  # noqa: E402
from blackbox.supervisor.rules import FatalLines  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "gpu_corpus"
CASES = CORPUS / "cases"
_TB_FILE = re.compile(r'^\s*File "(.*)", line (\d+), in (.*)$')
_EXC = re.compile(r"^\s*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): (.*)$")
_LLDB = re.compile(r"frame #\d+: 0x[0-9a-f]+ ([^`\s]+)`(.+?)(?: \+ \d+)?(?: at \S+)?$")
_GDB = re.compile(r"^#\d+\s+0x[0-9a-f]+ in (.+?) \(\)(?: (?:from )?(\S+))?\s*$")


def case_files(names: list[str]) -> list[Path]:
    files = sorted(CASES.glob("*.json"))
    return [f for f in files if not names or f.stem in names or f.stem.split("-")[0] in names]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _unboxed(text: str) -> list[str]:
    """A traceback as rich prints it, in a box (`│   File ...`): the lines without the box."""
    return [line.replace("│", "").rstrip() for line in text.splitlines()]


def traceback_frames(text: str) -> list[dict[str, Any]]:
    """The `File "...", line N, in f` lines of a posted traceback, outermost first."""
    out = []
    for line in _unboxed(text):
        m = _TB_FILE.match(line)
        if m:
            out.append({"file": m.group(1), "line": int(m.group(2)), "function": m.group(3).strip()})
    return out


def exception_record(text: str, order: int) -> Optional[dict[str, Any]]:
    """The rank's exception as the recorder records it: the first `Type: message` line, its traceback's frames."""
    for line in _unboxed(text):
        m = _EXC.match(line)
        if m:
            return {"time": float(order), "thread": "MainThread", "type": m.group(1), "message": m.group(2),
                    "traceback": traceback_frames(text)}  # fmt: skip
    return None


def native_frames(text: str, fmt: str) -> list[dict[str, Any]]:
    """An lldb or gdb backtrace (innermost first) as py-spy's native frames: the symbol, its library as the module."""
    frames = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        line = line.strip()
        if fmt == "lldb":
            m = _LLDB.search(line)
            if m:
                module, symbol = m.group(1), m.group(2)
                frames.append({"name": symbol.split("(")[0] if "::" in symbol else symbol, "filename": module,
                               "module": module, "line": 0})  # fmt: skip
        else:
            m = _GDB.match(line)
            if m:
                module = m.group(2) or (lines[i + 1].strip().removeprefix("from ").strip() if i + 1 < len(lines) and
                                        lines[i + 1].strip().startswith("from ") else "?")  # fmt: skip
                name = m.group(1)
                frames.append({"name": name.split("(")[0] if "::" in name else name, "filename": module,
                               "module": module, "line": 0})  # fmt: skip
    return frames


def trigger_of(case: dict[str, Any], console: str) -> tuple[Trigger, dict[str, Any]]:
    """How `blackbox run` would have been triggered: the supervisor's fatal-line rule over the console, or the rule
    the case names."""
    rule = case["bundle"]["trigger"]
    if rule == "console":
        lines = FatalLines()
        for kind, line in lines.feed((console + "\n").encode()):
            if kind != "exception":
                return Trigger("console", kind), {"rule": "console", "ranks": [], "reason": f"the job printed `{line}`"}
        raise SystemExit(f"{case['id']}: no fatal line in its console for a console trigger")
    reasons = {"stall": "no rank made progress for the stall timeout", "exception": "a rank raised an exception"}
    return Trigger(rule), {"rule": rule, "ranks": [], "reason": reasons[rule]}


def build(path: Path, out_dir: Path) -> Path:
    case = json.loads(path.read_text())
    w = BundleWriter(f"corpus-{case['id']}", case["bundle"].get("node", "gpu-node"), Trigger("manual"))
    console: list[str] = []
    alive: dict[int, bool] = {}
    for order, ev in enumerate(case["evidence"], 1):
        kind, text = ev["kind"], ev["text"]
        ranks = ev.get("ranks", [ev["rank"]] if "rank" in ev else [])
        if kind == "console":
            console.append(text)
        elif kind == "pyspy":
            for r in ranks:
                w.add_json(f"ranks/{r}/py-spy.json", pyspy.parse_text(text))
                alive[r] = True
        elif kind == "faulthandler":
            ident = re.search(r"Thread (0x[0-9a-f]+)", text)
            for r in ranks:
                w.add_bytes(f"ranks/{r}/stacks-1.txt", (text + "\n").encode())
                w.add_json(f"ranks/{r}/threads.json", {ident.group(1): "MainThread"} if ident else {})
                alive[r] = True
        elif kind in ("traceback", "interrupted"):  # raised; or where a hung rank was when it was interrupted
            console.append(text)
            frames = traceback_frames(text)
            for r in ranks:
                if kind == "traceback":
                    rec = exception_record(text, order)
                    if rec is None:
                        raise SystemExit(f"{case['id']}: no `Type: message` line in the traceback of rank {r}")
                    w.add_bytes(f"ranks/{r}/exceptions.jsonl", (json.dumps(rec) + "\n").encode())
                    alive[r] = False
                else:
                    thread = [{"thread_id": 1, "thread_name": "MainThread", "owns_gil": False, "frames": [
                        {"name": f["function"], "filename": f["file"], "line": f["line"], "module": None}
                        for f in reversed(frames)]}]  # fmt: skip
                    w.add_json(f"ranks/{r}/py-spy.json", thread)
                    alive[r] = True
        elif kind in ("lldb", "gdb"):
            thread = [{"thread_id": 1, "thread_name": "MainThread", "owns_gil": False,
                       "frames": native_frames(text, kind)}]  # fmt: skip
            for r in ranks:
                w.add_json(f"ranks/{r}/py-spy-native.json", thread)
                w.add_json(f"ranks/{r}/py-spy.json", thread)
                alive[r] = True
        else:
            raise SystemExit(f"{case['id']}: unknown evidence kind `{kind}`")
    text = "\n".join(console)
    if text:
        w.add_bytes("console-tail.log", (text + "\n").encode())
    trigger, detection = trigger_of(case, text)
    w.trigger = trigger
    w.add_json("detection.json", detection)
    local = [{"rank": r, "pid": 1000 + r, "local_rank": r, "recorder": False, "alive": a}
             for r, a in sorted(alive.items())]  # fmt: skip
    extra = {"job": {"world_size": case["bundle"]["world_size"], "local_ranks": local},
             "corpus": {"case": case["id"], "case_sha256": digest(path), "sources": case["sources"]}}  # fmt: skip
    (out_dir / f"{case['id']}.tar.gz").unlink(missing_ok=True)  # the writer never overwrites: replace it here
    written = w.write(str(out_dir), extra, f"{case['id']}.tar.gz")
    return Path(written.path)


def build_in_memory(path: Path) -> Bundle:
    """The case's bundle, built into a temporary directory and read back (for the tests)."""
    from blackbox.bundle.reader import read_bundle

    with tempfile.TemporaryDirectory() as tmp:
        return read_bundle(str(build(path, Path(tmp))))


def main() -> int:
    files = case_files(sys.argv[1:])
    if not files:
        raise SystemExit(f"no case under {CASES} matches {sys.argv[1:]}")
    for path in files:
        out = build(path, CORPUS)
        print(f"{path.stem}: {out.relative_to(ROOT)} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
