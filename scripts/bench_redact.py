"""Benchmark: redaction of one 64 KiB line of each shape that once made it quadratic (a URL query, a fingerprint
`ab:ab:…`, a long base64 value) and of the shapes a job prints most (log lines, a tqdm bar, a row of dashes, JSON
metrics), with 20 credentials known (their JSON-escaped, URL-encoded and base64 forms scrubbed in the same pass).
Target: at most 10 ms a line on the 2-core dev machine; every function linear in its input, so a 256 KiB line costs
about four times as much. Then the console log's rate: MB/s of a mixed ML log (training lines, tqdm bars, NCCL
lines, warnings, a config dump, JSON metrics, a traceback, a few credentials) and of each of its kinds alone,
redacted as console.log does it (a StreamRedactor per stream, fed the tee's chunks). Target: >= 10 MB/s mixed.
Prints Markdown tables (docs/benchmarks.md quotes them).
Run with the project's venv: python scripts/bench_redact.py [--repeats N] [--mb N]"""

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


def ml_log_kinds(rng: random.Random, lines: int) -> dict[str, list[str]]:
    """The kinds of lines a training job prints, `lines` of each."""
    tok = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(34))
    config = ["model:", "  name: meta-llama/Llama-3-8B", "  hidden_size: 4096", "  num_attention_heads: 32",
              "  key_dim: 128", "tokenizer:", "  pad_token: <pad>", "  eos_token_id: 2", "  max_tokens: 8192",
              "optimizer:", "  lr: 3.0e-4", "  weight_decay: 0.1", "wandb:", "  project: pretrain",
              "  api_key: " + tok, "data:", "  path: /data/shards/train-{00000..01023}.tar"]  # fmt: skip
    trace = ["Traceback (most recent call last):", '  File "/opt/train.py", line 212, in <module>',
             "    loss = model(batch).loss", '  File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py",'
             " line 1511, in _wrapped_call_impl",
             "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"]  # fmt: skip
    return {
        "training lines": [
            f"[rank{i % 8}]:step {i} | loss {2 + rng.random():.4f} | lr 3.00e-04 | grad_norm "
            f"{rng.random():.3f} | tokens_per_sec {51234 + i} | mem 71.3 GiB"
            for i in range(lines)
        ],
        "tqdm bars": [
            f"\rEpoch 3:  {i % 100:3d}%|{'#' * (i % 40):<40}| {i}/100000 [01:23<12:34, 12.3it/s, "
            f"loss={rng.random():.3f}]"
            for i in range(lines)
        ],
        "NCCL INFO": [
            f"node{i % 4}:{1000 + i % 8}:{2000 + i % 8} [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : "
            f"{i % 8}[{i % 8}] -> {(i + 1) % 8}[{(i + 1) % 8}] via P2P/CUMEM/read"
            for i in range(lines)
        ],
        "warnings": [
            f"/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py:{550 + i % 9}: UserWarning:"
            " This DataLoader will create 16 worker processes in total. Our suggested max number of worker"
            " in current system is 8, which is smaller than what this DataLoader is going to create."
            for i in range(lines)
        ],
        "config dumps": [config[i % len(config)] for i in range(lines)],
        "JSON metrics": [
            '{"step": %d, "loss": %.4f, "tokens_per_sec": %d, "key_dim": 128, "session": "run-%d"}'
            % (i, rng.random(), 51234 + i, i % 3)
            for i in range(lines)
        ],
        "tracebacks": [trace[i % len(trace)] for i in range(lines)],
    }


def mixed_log(rng: random.Random, size: int) -> tuple[dict[str, str], str]:
    """Each kind alone, and all of them mixed as a job interleaves them (mostly training lines and bars)."""
    kinds = ml_log_kinds(rng, size // 80)
    alone = {name: "\n".join(lines)[:size] + "\n" for name, lines in kinds.items()}
    weights = {"training lines": 40, "tqdm bars": 20, "NCCL INFO": 10, "warnings": 8, "config dumps": 8,
               "JSON metrics": 10, "tracebacks": 4}  # fmt: skip
    names = list(weights)
    out: list[str] = []
    total = 0
    pos = dict.fromkeys(names, 0)
    while total < size:
        name = rng.choices(names, [weights[n] for n in names])[0]
        line = kinds[name][pos[name] % len(kinds[name])]
        pos[name] += 1
        out.append(line)
        total += len(line) + 1
    return alone, "\n".join(out) + "\n"


def console_rate(text: str, repeats: int, chunk: int = 4096) -> float:
    """MB/s of text redacted as console.log does it: the tee's chunks, cut at line ends, to one StreamRedactor."""
    chunks = []
    i = 0
    while i < len(text):
        j = text.find("\n", i + chunk)
        j = len(text) if j < 0 else j + 1
        chunks.append(text[i:j])
        i = j
    best = float("inf")
    for _ in range(repeats):
        r = StreamRedactor()
        t = time.perf_counter()
        for c in chunks:
            r(c)
        best = min(best, time.perf_counter() - t)
    return len(text.encode()) / best / 1e6


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
    p.add_argument("--mb", type=float, default=4.0, help="size of the mixed ML log")
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
    alone, mixed = mixed_log(random.Random(2), int(args.mb * 1e6))
    print("\n| console log | MB | console.log (MB/s) | redact_text whole (MB/s) |")
    print("| --- | ---: | ---: | ---: |")
    for name, text in [("mixed ML log", mixed), *alone.items()]:
        rate = console_rate(text, max(1, args.repeats // 3))
        whole = len(text.encode()) / (timed(redact_text, text, max(1, args.repeats // 3))[0] / 1000) / 1e6
        print(f"| {name} | {len(text) / 1e6:.1f} | {rate:.1f} | {whole:.1f} |")
    print(f"\nbest of {max(1, args.repeats // 3)} runs; console.log: 4 KiB chunks at line ends, one StreamRedactor.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
