"""The reference in docs/ stays true to the code where it is generated from it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gen_docs  # noqa: E402


def test_the_options_table_is_generated_from_the_options() -> None:
    text = gen_docs.RUN_DOC.read_text()
    assert gen_docs.rendered(text) == text, "docs/run.md's options table is stale: run python scripts/gen_docs.py"
    from blackbox.config import RUN_OPTIONS

    assert all(f"`{o.flag}`" in text and f"`{o.env}`" in text for o in RUN_OPTIONS)


def test_the_readme_fits_on_two_screens_and_links_the_reference() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 140, "README.md: keep it to what a newcomer needs; the reference is docs/"
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{doc.name}" in readme, f"README.md does not link docs/{doc.name}"


def test_the_hang_benchmarks_tables_are_generated_from_its_result() -> None:
    text = gen_docs.BENCH_DOC.read_text()
    assert gen_docs.rendered_bench(text) == text, "docs/benchmarks.md's hang benchmark is stale: scripts/gen_docs.py"
