"""The GPU corpus: real NCCL hangs and crashes from public issue threads (tests/data/gpu_corpus/cases/*.json: the
thread, the evidence as posted, the verdict its resolution states), as bundles made by scripts/make_gpu_corpus.py.
Every bundle must get the thread's answer: its exact category and its exact suspects — or, where the thread does not
say which rank, a case that says so (`no_suspect_named`) and a verdict that names none — and the fix it names in the
next actions. A rank the bundle has no evidence for is never a suspect by its absence alone; the tests below vary a
case's world size and which ranks' evidence it holds. The session prints the table."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle
from tests.conftest import table_row

ROOT = Path(__file__).resolve().parent.parent.parent
CORPUS = ROOT / "tests" / "data" / "gpu_corpus"
CASES = sorted((CORPUS / "cases").glob("*.json"))
sys.path.insert(0, str(ROOT / "scripts"))
from make_gpu_corpus import build_in_memory, digest  # noqa: E402


def _expected(want: dict[str, Any]) -> str:
    return f"{want['category']} {want['suspect_ranks'] or 'no suspect named'}"


def check(want: dict[str, Any], category: str, suspects: list[int], actions: str) -> list[str]:
    """What differs from the thread's answer (empty when nothing does): the exact category and suspect set."""
    wrong = []
    if category != want["category"]:
        wrong.append(f"category {category}, the thread's {want['category']}")
    if suspects != want["suspect_ranks"]:
        wrong.append(f"suspects {suspects}, the thread's {want['suspect_ranks'] or 'none named'}")
    wrong += [f"no next action names `{w}`" for w in want.get("next_action_contains", []) if w not in actions]
    return wrong


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_every_case_gets_its_threads_answer(request: pytest.FixtureRequest, path: Path) -> None:
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
    got = f"{v.category} {v.suspect_ranks}"
    table_row(request, "gpu corpus", (case["id"], source, _expected(case["expected"]), got, not wrong))
    assert not wrong, f"{case['id']}: " + "; ".join(wrong) + f"\n{v.summary}\n" + "\n".join(report.next_actions)


def test_every_case_states_an_exact_answer_or_says_why_it_names_no_rank() -> None:
    for path in CASES:
        want = json.loads(path.read_text())["expected"]
        assert isinstance(want.get("category"), str) and isinstance(want.get("suspect_ranks"), list), path.stem
        assert not {"suspects_include", "not_suspects"} & set(want), f"{path.stem}: a partial answer"
        assert bool(want["suspect_ranks"]) != bool(want.get("no_suspect_named")), f"{path.stem}: say why none"


def test_the_corpus_covers_the_shapes_of_real_gpu_jobs() -> None:
    cases = [json.loads(p.read_text()) for p in CASES]
    assert len(cases) >= 20
    frameworks = " ".join(c["framework"] for c in cases)
    for word in ("DDP", "FSDP1", "FSDP2", "ZeRO-3", "Megatron", "PP"):
        assert word in frameworks, word
    categories = {c["expected"].get("category") for c in cases}
    assert {"crash.comm_timeout", "crash.cuda_error", "crash.oom", "crash.network_setup"} <= categories
    assert all(c["sources"] and c["resolution"] and c["evidence"] and c["answer"] for c in cases)


def _varied(tmp_path: Path, stem: str, world: int, drop: Optional[int] = None) -> Any:
    """A case's report with its world size set, and without rank `drop`'s evidence (its ranks list)."""
    case = json.loads(next((CORPUS / "cases").glob(f"{stem}-*.json")).read_text())
    case["bundle"]["world_size"] = world
    for ev in case["evidence"]:
        if drop is not None and drop in ev.get("ranks", []):
            ev["ranks"] = [r for r in ev["ranks"] if r != drop]
    path = tmp_path / f"{case['id']}.json"
    path.write_text(json.dumps(case))
    return analyze(build_in_memory(path))


@pytest.mark.parametrize("world", [8, 35, 40, 64])
def test_case_26_names_no_rank_at_any_world_size_the_waiting_ones_least(tmp_path: Path, world: int) -> None:
    report = _varied(tmp_path, "26", world)
    assert (report.verdict.category, report.verdict.suspect_ranks) == ("crash.comm_timeout", [])
    assert report.verdict.confidence == "low"
    no_evidence = [f.text for f in report.findings if f.text.startswith("no evidence: ")]
    assert no_evidence and f"of {world} are in nothing this bundle holds" in no_evidence[0]


@pytest.mark.parametrize(("stem", "world", "drop", "suspects"), [
    ("02", 4, None, [0]),  # ranks 1-3 wait in #19: the one rank left, by elimination
    ("02", 8, None, []),  # five ranks without evidence: none of them is named by its absence
    ("16", 8, None, [7]),  # ranks 0-6 wait: rank 7, by elimination
    ("16", 16, None, []),
    ("16", 8, 6, []),  # rank 6's stack taken away: ranks 6 and 7 have no evidence, neither is named
])  # fmt: skip
def test_a_rank_without_evidence_is_a_suspect_only_by_elimination(
    tmp_path: Path, stem: str, world: int, drop: Optional[int], suspects: list[int]
) -> None:
    report = _varied(tmp_path, stem, world, drop)
    assert report.verdict.suspect_ranks == suspects
    if not suspects:
        assert report.verdict.confidence == "low"
        assert any(f.text.startswith("no evidence: ") for f in report.findings)


def corpus_table(rows: list[tuple[str, str, str, str, bool]]) -> str:
    """The table of the corpus, printed at the end of the session (conftest.pytest_terminal_summary)."""
    width = max(len(r[0]) for r in rows)
    lines = [f"{'case':<{width}}  {'source':<36}  {'expected':<40}  got"]
    for c, s, e, g, ok in rows:
        lines.append(f"{c:<{width}}  {s[:36]:<36}  {e:<40}  {g[:60]}{'' if ok else '   <-- DIFFERS'}")
    return "\n".join(lines)
