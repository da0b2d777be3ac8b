"""Benchmark: redaction of one 64 KiB line of each shape that once made it quadratic (a URL query, a fingerprint
`ab:ab:…`, a long base64 value) and of the shapes a job prints most (log lines, a tqdm bar, a row of dashes, JSON
metrics), with 20 credentials known (their JSON-escaped, URL-encoded and base64 forms scrubbed in the same pass).
Target: at most 10 ms a line on the 2-core dev machine; every function linear in its input, so a 256 KiB line costs
about four times as much. Prints a Markdown table (docs/benchmarks.md quotes it).
Run with the project's venv: python scripts/bench_redact.py [--repeats N]"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from blackbox.redact import StreamRedactor, add_known_secrets, redact_config, redact_text

SIZE = 64 * 1024


def _fill(unit: str, prefix: str = "", size: int = SIZE) -> str:
    return (prefix + unit * (size // len(unit) + 1))[:size]


def shapes(size: int = SIZE) -> dict[str, str]:
    rng = random.Random(0)
    b64 = "".join(rng.choice(string.ascii_letters + string.digits + "+/") for _ in range(size))
    log = "".join(f"step {i} loss {i * 1e-6:.6f} lr 0.001 tokens_per_sec {51234 + i}\n" for i in range(size // 50))
    return {
        "URL query `?a=b&a=b…`": _fill("a=b&", "GET https://host/x?", size),
        "fingerprint `ab:ab:…`": _fill("ab:", "Key fingerprint ", size),
        "base64 value after `key=`": ("key=" + b64)[:size],
        "base64 alone": b64,
        "password: one long value": ("password: " + b64)[:size],
        "`token:token:…`": _fill("token:", "", size),
        "JSON metrics": _fill('{"step": 10, "tokens_per_sec": 51234.2, "loss": 1.25, "key_dim": 64}, ', "[", size),
        "log lines (with `tokens_per_sec`)": log[:size],
        "tqdm bar (`\\r` updates)": _fill("\r 4242/100000 [#####     ] 12.3it/s", "", size),
        "a row of dashes": "-" * size,
        "x" * 3: "x" * size,
    }


def timed(fn: Callable[[str], object], text: str, repeats: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(text)
        runs.append(time.perf_counter() - t)
    return min(runs) * 1000, statistics.median(runs) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    rng = random.Random(1)
    add_known_secrets({f"SERVICE_{i}_API_KEY": "".join(rng.choice(string.ascii_letters + string.digits)
                                                        for _ in range(32)) for i in range(20)})  # fmt: skip
    print("| 64 KiB line | redact_text best (ms) | median (ms) | stream (ms) | config (ms) | 256 KiB / 64 KiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, text in shapes().items():
        best, median = timed(redact_text, text + "\n", args.repeats)
        stream, _ = timed(lambda t: StreamRedactor().feed(t), text + "\n", args.repeats)
        config, _ = timed(redact_config, text + "\n", args.repeats)
        big = shapes(4 * SIZE)[name] + "\n"
        ratio = timed(redact_text, big, max(3, args.repeats // 3))[0] / max(best, 1e-6)
        print(f"| {name} | {best:.2f} | {median:.2f} | {stream:.2f} | {config:.2f} | {ratio:.1f}x |")
    print(f"\nbest and median of {args.repeats} runs; 20 credentials known; the last column: a 256 KiB line of the "
          "same shape against the 64 KiB one (linear: about 4x).")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
