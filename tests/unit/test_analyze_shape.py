"""The analysis reads as a short pipeline of small steps (STYLE.md): no function of blackbox/analyze/ is longer than
120 lines, and the dead ends a review found stay gone. Read from the source (ast)."""

from __future__ import annotations

import ast
from pathlib import Path

ANALYZE = Path(__file__).resolve().parent.parent.parent / "blackbox" / "analyze"
MAX_LINES = 120


def test_no_function_of_the_analysis_is_longer_than_120_lines() -> None:
    long = []
    for path in sorted(ANALYZE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_the_dead_code_the_review_found_stays_gone() -> None:
    sources = {p.name: p.read_text() for p in ANALYZE.glob("*.py")}
    frames = (ANALYZE.parent / "frames.py").read_text()
    assert not any("def _plural_ranks" in s for s in sources.values())  # one plural_ranks, in detections
    assert "def waits_in" not in sources["stackgroups.py"] and "KINDS =" not in frames
    assert 'detection.get("suspects")' not in sources["verdict.py"]  # never written by the supervisor
    assert "left_early" not in sources["states.py"]
    tree = ast.parse(sources["blame.py"])
    later = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_later")
    assert [a.arg for a in later.args.args] == ["exc"]
