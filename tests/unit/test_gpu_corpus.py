"""The GPU corpus: real NCCL hangs and crashes from public issue threads (tests/data/gpu_corpus/cases/*.json: the
thread, the evidence as posted, the verdict its resolution states), as bundles made by scripts/make_gpu_corpus.py.
Every bundle must get the thread's answer: its category, its suspects (or, where the thread names none, not the
ranks it shows to be waiting), and the fix it names in the next actions. The session prints the table."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle

ROOT = Path(__file__).resolve().parent.parent.parent
CORPUS = ROOT / "tests" / "data" / "gpu_corpus"
CASES = sorted((CORPUS / "cases").glob("*.json"))
ROWS: list[tuple[str, str, str, str, bool]] = []
sys.path.insert(0, str(ROOT / "scripts"))
from make_gpu_corpus import digest  # noqa: E402


def _expected(want: dict[str, Any]) -> str:
    parts = [str(want["category"])] if want.get("category") else []
    if want.get("suspect_ranks") is not None:
        parts.append(str(want["suspect_ranks"]))
    if want.get("suspects_include"):
        parts.append(f"incl {want['suspects_include']}")
    if want.get("not_suspects"):
        parts.append(f"not {want['not_suspects']}")
    return " ".join(parts)


def check(want: dict[str, Any], category: str, suspects: list[int], actions: str) -> list[str]:
    """What differs from the thread's answer (empty when nothing does)."""
    wrong = []
    if want.get("category") and category != want["category"]:
        wrong.append(f"category {category}, the thread's {want['category']}")
    if want.get("suspect_ranks") is not None and suspects != want["suspect_ranks"]:
        wrong.append(f"suspects {suspects}, the thread's {want['suspect_ranks']}")
    if not set(want.get("suspects_include", [])) <= set(suspects):
        wrong.append(f"suspects {suspects} lack {want['suspects_include']}")
    if set(want.get("not_suspects", [])) & set(suspects):
        wrong.append(f"suspects {suspects} name a rank the thread shows waiting: {want['not_suspects']}")
    wrong += [f"no next action names `{w}`" for w in want.get("next_action_contains", []) if w not in actions]
    return wrong


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_every_case_gets_its_threads_answer(path: Path) -> None:
    case = json.loads(path.read_text())
    bundle_path = CORPUS / f"{case['id']}.tar.gz"
    assert bundle_path.exists(), f"no bundle for {case['id']}: run python scripts/make_gpu_corpus.py {case['id']}"
    bundle = read_bundle(str(bundle_path))
    corpus = bundle.section("corpus")
    assert corpus.get("case_sha256") == digest(path), f"{bundle_path.name} is stale: run scripts/make_gpu_corpus.py"
    report = analyze(bundle)
    v = report.verdict
    wrong = check(case["expected"], v.category, v.suspect_ranks, " ".join(report.next_actions))
    source = case["sources"][0].removeprefix("https://github.com/")
    ROWS.append((case["id"], source, _expected(case["expected"]), f"{v.category} {v.suspect_ranks}", not wrong))
    assert not wrong, f"{case['id']}: " + "; ".join(wrong) + f"\n{v.summary}\n" + "\n".join(report.next_actions)


def test_the_corpus_covers_the_shapes_of_real_gpu_jobs() -> None:
    cases = [json.loads(p.read_text()) for p in CASES]
    assert len(cases) >= 20
    frameworks = " ".join(c["framework"] for c in cases)
    for word in ("DDP", "FSDP1", "FSDP2", "ZeRO-3", "Megatron", "PP"):
        assert word in frameworks, word
    categories = {c["expected"].get("category") for c in cases}
    assert {"crash.comm_timeout", "crash.cuda_error", "crash.oom", "crash.network_setup"} <= categories
    assert all(c["sources"] and c["resolution"] and c["evidence"] and c["answer"] for c in cases)


@pytest.fixture(scope="module", autouse=True)
def _table(request: pytest.FixtureRequest) -> Any:
    """The table of the corpus, written to the terminal once the module's tests ran (whatever the capture)."""
    yield
    if not ROWS:
        return
    width = max(len(r[0]) for r in ROWS)
    lines = [f"{'case':<{width}}  {'source':<36}  {'expected':<40}  got"]
    for c, s, e, g, ok in ROWS:
        lines.append(f"{c:<{width}}  {s[:36]:<36}  {e:<40}  {g[:60]}{'' if ok else '   <-- DIFFERS'}")
    text = "\nGPU corpus: the thread's answer and blackbox's\n" + "\n".join(lines)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print(text, flush=True)
