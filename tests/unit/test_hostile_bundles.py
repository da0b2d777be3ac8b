"""`blackbox report` on hostile bundles: each case is a real bundle with one thing made malicious or absurd. Every
one must give exit 0 (a report) or exit 2 (one sentence), within seconds and a bounded amount of memory, and
nothing in a bundle may reach the terminal as markup or an escape sequence, or the HTML page as markup. The
cases run in one child process (tests/programs/report_many.py) under a memory limit."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import random
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Callable

import pytest

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"
DRIVER = Path(__file__).resolve().parent.parent / "programs" / "report_many.py"
BASE = GOLDEN / "ddp-data-hang.tar.gz"
MEMORY_MB = 800  # address space of the whole child: interpreter, rich, the bundle and its analysis
SECONDS = 20

Members = dict[str, bytes]


def members(path: Path = BASE) -> Members:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def write(path: Path, files: Members) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def edit_json(files: Members, name: str, change: Callable[[Any], Any]) -> Members:
    value = json.loads(files[name])
    out = change(value)
    files[name] = json.dumps(value if out is None else out).encode()
    return files


def header(name: str, size_field: bytes, kind: bytes) -> bytes:
    """One ustar header block with any size field, its checksum right."""
    h = bytearray(512)
    h[0 : len(name)] = name.encode()
    h[100:108] = b"0000600\0"
    h[124:136] = size_field.ljust(12, b"\0")[:12]
    h[156:157] = kind
    h[257:263] = b"ustar\0"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def raw_tar(blocks: list[bytes], files: Members) -> bytes:
    """Hand-built headers first, then a normal archive of `files`; gzipped."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(b"".join(blocks) + buf.getvalue())


def pax(records: dict[str, str]) -> bytes:
    body = b""
    for key, value in records.items():
        rec = f" {key}={value}\n".encode()
        n = len(rec) + len(str(len(rec)))
        n = len(rec) + len(str(n))
        body += str(n).encode() + rec
    return header("pax", b"%011o" % len(body), b"x") + body.ljust((len(body) + 511) // 512 * 512, b"\0")


def dag_pickle() -> bytes:
    """A flight-recorder dump whose frames are 60 levels of shared references: 2**60 paths, a few hundred bytes."""
    dump = pickle.loads(members()["flight_recorder/fr_trace_0"])
    node: Any = [{"name": "f", "filename": "x.py", "line": 1}]
    for _ in range(60):
        node = [node, node]
    dump["entries"][0]["frames"] = node
    dump["entries"][0]["input_sizes"] = node
    return pickle.dumps(dump)


MARKUP = (
    "[/] [bold red]x[/bold red] [link=http://evil]y[/link] :smile: \x1b[2J\x1b]0;pwned\x07 <img src=x onerror=alert(1)>"
)


def _case_files() -> dict[str, Callable[[Path], Path]]:
    """name -> builds the hostile bundle in a directory and returns its path."""

    def mutate(change: Callable[[Members], Members]) -> Callable[[Path], Path]:
        return lambda d: write(d / "b.tar.gz", change(members()))

    def raw(blocks: Callable[[], list[bytes]]) -> Callable[[Path], Path]:
        def build(d: Path) -> Path:
            path = d / "b.tar.gz"
            path.write_bytes(raw_tar(blocks(), members()))
            return path

        return build

    def job(key: str, value: Any) -> Callable[[Members], Members]:
        return lambda f: edit_json(f, "manifest.json", lambda m: m["job"].__setitem__(key, value))

    def deep(f: Members) -> Members:
        f["manifest.json"] = f["manifest.json"][:-1] + b', "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        return f

    def deep_member(f: Members) -> Members:
        f["ranks/1/heartbeat.json"] = b"[" * 100_000 + b"]" * 100_000
        return f

    def many_dicts(f: Members) -> Members:
        f["manifest.json"] = f["manifest.json"][:-1] + b', "x": [' + b"{}," * 5_500_000 + b"{}]}"
        return f

    def superscript_rank(f: Members) -> Members:
        f["ranks/\u00b2/heartbeat.json"] = f["ranks/1/heartbeat.json"]
        return f

    def fr_list_status(f: Members) -> Members:
        dump = pickle.loads(f["flight_recorder/fr_trace_0"])
        dump["pg_status"] = [1, 2, 3]
        f["flight_recorder/fr_trace_0"] = pickle.dumps(dump)
        return f

    def fr_bad_status(f: Members) -> Members:
        dump = pickle.loads(f["flight_recorder/fr_trace_0"])
        dump["pg_status"] = {"0": {"last_enqueued_collective": "many", "last_completed_collective": [1]}}
        f["flight_recorder/fr_trace_0"] = pickle.dumps(dump)
        return f

    def fr_dag(f: Members) -> Members:
        f["flight_recorder/fr_trace_0"] = dag_pickle()
        return f

    def exception(f: Members) -> Members:
        f["ranks/1/exception.json"] = json.dumps({"type": MARKUP, "message": MARKUP, "traceback": [
            {"filename": MARKUP, "line": "twelve", "name": MARKUP}, {"filename": "a.py", "line": [1], "name": 3}],
            "time": "yesterday"}).encode()  # fmt: skip
        return f

    def markup_everywhere(f: Members) -> Members:
        edit_json(f, "manifest.json", lambda m: m.update(run_id=MARKUP, node=MARKUP, trigger=MARKUP))
        edit_json(f, "ranks/1/heartbeat.json", lambda h: h.update(phase=MARKUP, pid=MARKUP, step=MARKUP))
        f["console-tail.log"] = (MARKUP + "\n").encode() * 5
        return f

    def gpu_history(f: Members) -> Members:
        sample = {"t": 1.0, "name": MARKUP, "utilization_pct": "busy", "temperature_c": MARKUP,
                  "memory_used_mib": MARKUP, "throttle": MARKUP, "ecc_uncorrected": "many"}  # fmt: skip
        f["node/gpu-history.json"] = json.dumps({"0": [sample, {**sample, "t": 2.0}], MARKUP: [sample]}).encode()
        return f

    def detection_markup(f: Members) -> Members:
        return edit_json(f, "detection.json", lambda d: d.update(rule=MARKUP, reason=MARKUP, ranks=MARKUP))

    def wrong_types(f: Members) -> Members:
        for name in list(f):
            if name.endswith(".json") and name != "manifest.json":
                f[name] = b'"a string where a table belongs"'
        return f

    def ring_and_unanswered(f: Members) -> Members:  # a rank's ring and why it did not answer, made up
        ring = [7, None, {"n": "x"}, {"n": 1, "phase": MARKUP, "collective": MARKUP, "seq": [1], "start_wall": 1e300,
                                      "step": "x"},
                {"n": 2, "phase": "collective", "collective": {"a": 1}, "seq": 10**30, "start_wall": 1e19},
                {"n": 3, "phase": "collective", "collective": MARKUP * 50, "seq": 3,
                 "start_wall": 5e9}, {"n": 4, "phase": MARKUP, "start_wall": float("inf")}]  # fmt: skip
        for name in [n for n in f if n.startswith("flight_recorder/") or n.endswith("/fr_trace.json")]:  # ring read
            del f[name]
        edit_json(f, "ranks/1/heartbeat.json", lambda hb: hb.__setitem__("ring", ring))
        edit_json(f, "ranks/0/heartbeat.json", lambda hb: hb.__setitem__("ring", "not a list"))
        return edit_json(f, "manifest.json", lambda m: m.__setitem__("collection", {"unanswered": {
            "0": ["x"], "x": "stopped", "1": MARKUP, "3": "stopped"}}))  # fmt: skip

    def nulls(f: Members) -> Members:
        for name in list(f):
            if name.endswith(".json") and name != "manifest.json":
                f[name] = b"null"
        return f

    def manifest_sections(f: Members) -> Members:
        return edit_json(f, "manifest.json", lambda m: m.update(job=[1], incident="x", multinode=7, nodes="n",
                                                                rank_nodes=[None], created={"a": 1}))  # fmt: skip

    def peer_preemption(f: Members) -> Members:  # the node preempted before the incident, made up
        return edit_json(f, "manifest.json", lambda m: m.update(incident={"after_peer_preemption": {
            "node": MARKUP, "host": [1], "why": MARKUP * 100, "time": 1e300}}))  # fmt: skip

    return {
        "incident: a peer's preemption of markup and absurd numbers": mutate(peer_preemption),
        "tar: x header with a negative size": raw(lambda: [header("pax", b"-1000", b"x")]),
        "tar: L header with a negative size": raw(lambda: [header("long", b"-512", b"L")]),
        "tar: g header with a negative size": raw(lambda: [header("g", b"-512", b"g")]),
        "tar: base-256 negative size": raw(lambda: [header("x", b"\xff" * 12, b"x")]),
        "tar: PAX size is a superscript digit": raw(lambda: [pax({"size": "\u00b2", "path": "manifest.json"})]),
        "tar: PAX size of 5000 digits": raw(lambda: [pax({"size": "9" * 5000})]),
        "tar: PAX record length of 5000 digits": raw(
            lambda: [header("pax", b"%011o" % 5010, b"x") + (b"9" * 5000 + b" a=b\n").ljust(5120, b"\0")]
        ),
        "manifest: world_size 10**15": mutate(job("world_size", 10**15)),
        "manifest: world_size negative": mutate(job("world_size", -(10**15))),
        "manifest: world_size a string": mutate(job("world_size", MARKUP)),
        "manifest: local_ranks not a list": mutate(job("local_ranks", 7)),
        "manifest: local_ranks of junk": mutate(job("local_ranks", [7, "x", None, {"rank": "x", "pid": [1]}])),
        "manifest: sections of the wrong types": mutate(manifest_sections),
        "manifest: nested 100,000 deep": mutate(deep),
        "manifest: 5.5 million empty tables": mutate(many_dicts),
        "member: nested 100,000 deep": mutate(deep_member),
        "ranks/²/": mutate(superscript_rank),
        "flight recorder: pg_status a list": mutate(fr_list_status),
        "flight recorder: pg_status of junk": mutate(fr_bad_status),
        "flight recorder: a DAG of shared references": mutate(fr_dag),
        "exception: markup, and a line that is not a number": mutate(exception),
        "markup and escapes in run id, phase, console": mutate(markup_everywhere),
        "GPU history: strings for numbers, markup for a name": mutate(gpu_history),
        "detection: markup and wrong types": mutate(detection_markup),
        "every member a string": mutate(wrong_types),
        "every member null": mutate(nulls),
        "ring and unanswered: junk, markup, absurd numbers": mutate(ring_and_unanswered),
    }


CASES = _case_files()


def report_all(paths: list[Path], fmt: str) -> list[dict[str, Any]]:
    proc = subprocess.run([sys.executable, str(DRIVER), fmt, str(MEMORY_MB), str(SECONDS)],
                          input="\n".join(map(str, paths)), capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def problems(result: dict[str, Any], fmt: str) -> list[str]:
    """What is wrong with one report of a hostile bundle (nothing, for a pass)."""
    out = []
    if result["escaped"]:
        out.append(f"escaped: {result['escaped'][-1500:]}")
    if result["code"] not in (0, 2):
        out.append(f"exit {result['code']}: {result['stderr'][-1500:]}")
    if result["code"] == 2 and len(result["stderr"].strip().splitlines()) > 2:
        out.append(f"more than one sentence: {result['stderr'][-1500:]}")
    if result["seconds"] > 10:
        out.append(f"took {result['seconds']} s")
    text = result["stdout"] + result["stderr"]
    if any(c in text for c in "\x1b\x07\x9b"):
        out.append("a control character from the bundle reached the output")
    if fmt == "html" and "<img" in text:
        out.append("bundle text reached the HTML page as markup")
    if fmt in ("terminal", "markdown") and "[bold red]x" not in text and "[/]" in text:
        out.append("rich markup was interpreted")
    return out


@pytest.mark.parametrize("fmt", ["terminal", "html", "markdown", "json"])
def test_hostile_bundles_get_a_report_or_one_sentence(tmp_path: Path, fmt: str) -> None:
    paths = []
    for i, build in enumerate(CASES.values()):
        d = tmp_path / f"case{i}"
        d.mkdir()
        paths.append(build(d))
    results = report_all(paths, fmt)
    assert len(results) == len(paths)
    failed = {name: p for name, r in zip(CASES, results) if (p := problems(r, fmt))}
    assert not failed, json.dumps(failed, indent=1)[:8000]


def test_markup_in_a_bundle_is_shown_as_text(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (terminal,) = report_all([CASES["markup and escapes in run id, phase, console"](d)], "terminal")
    assert terminal["code"] == 0, terminal
    assert "[bold red]x[/bold red]" in terminal["stdout"]  # shown as written, not styled
    assert "\\x1b[2J" in terminal["stdout"]  # the escape is visible, and inert
    (page,) = report_all([d / "b.tar.gz"], "html")
    assert "&lt;img src=x onerror=alert(1)&gt;" in page["stdout"]


def test_a_pickle_of_shared_references_is_refused_before_anything_walks_it() -> None:
    """2**60 paths must not be followed (torch's own analyzer on the same bundle: tests/integration)."""
    from blackbox.adapters.flight_recorder import FlightRecorderError, load_dump

    with pytest.raises(FlightRecorderError, match="shared references expand"):
        load_dump(dag_pickle())


def _fuzz_value(rng: random.Random) -> Any:
    return rng.choice([None, True, -1, 0, 10**15, -(10**18), 1.5e308, float("nan"), "", "²", MARKUP, "x" * 5000,
                       [], [None], [MARKUP, -1], {}, {"a": None}, {MARKUP: [1]}, {"0": {"1": "x"}}])  # fmt: skip


def _mutate_json(value: Any, rng: random.Random) -> Any:
    """One random value somewhere inside `value` replaced."""
    if isinstance(value, dict) and value and rng.random() < 0.75:
        key = rng.choice(list(value))
        value[key] = _mutate_json(value[key], rng)
        return value
    if isinstance(value, list) and value and rng.random() < 0.75:
        i = rng.randrange(len(value))
        value[i] = _mutate_json(value[i], rng)
        return value
    return _fuzz_value(rng)


def fuzz_bundle(base: Members, rng: random.Random) -> Members:
    files = dict(base)
    for _ in range(rng.randint(1, 4)):
        name = rng.choice(sorted(files))
        data = files[name]
        roll = rng.random()
        if name.endswith((".json", "manifest.json")) and roll < 0.7:
            try:
                value = json.loads(data)
            except ValueError:
                continue
            files[name] = json.dumps(_mutate_json(value, rng)).encode()
        elif name.endswith(".jsonl") and roll < 0.7:
            lines = data.splitlines()
            if lines:
                i = rng.randrange(len(lines))
                try:
                    lines[i] = json.dumps(_mutate_json(json.loads(lines[i]), rng)).encode()
                except ValueError:
                    pass
                files[name] = b"\n".join(lines)
        elif roll < 0.8 and name != "manifest.json":
            del files[name]
        elif roll < 0.9:
            files[name] = data[: rng.randrange(len(data) + 1)]
        else:
            b = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                if b:
                    b[rng.randrange(len(b))] = rng.randrange(256)
            files[name] = bytes(b)
    return files


FUZZ_BASES = ["ddp-data-hang", "fsdp-data-hang", "comm-timeout", "oom", "segv", "mismatch", "straggler", "ddp-stopped"]


@pytest.mark.parametrize("fmt", ["terminal", "html"])
def test_fuzzed_bundles(tmp_path: Path, fmt: str) -> None:
    """Random mutations of real bundles (values replaced by hostile ones, members cut, dropped or corrupted):
    a fixed seed, so that a failure reproduces."""
    rng = random.Random(f"blackbox-fuzz-{fmt}")
    paths = []
    for i in range(150):
        base = members(GOLDEN / f"{FUZZ_BASES[i % len(FUZZ_BASES)]}.tar.gz")
        paths.append(write(tmp_path / f"f{i}.tar.gz", fuzz_bundle(base, rng)))
    results = report_all(paths, fmt)
    failed = {str(p.name): pr for p, r in zip(paths, results) if (pr := problems(r, fmt))}
    assert not failed, json.dumps(failed, indent=1)[:8000]
