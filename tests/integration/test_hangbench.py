"""The hang benchmark's quick subset (CI): blackbox with its defaults on three rows of the matrix (a data hang, a
rank that raises, a long checkpoint), run as real jobs side by side; it fails when a fault the committed run caught
is missed, or a healthy job the committed run left alone is ended or alarmed (docs/hangbench.json, from
`make bench-hangs`). The harness is under test here: the verdicts of the other rows, with the same defaults, are
test_quiet.py's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, job_env


@pytest.mark.timeout(420)
@pytest.mark.long
def test_blackbox_keeps_its_recall_and_its_quiet_on_the_quick_rows() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "hangbench.py"), "--quick", "--jobs", "3", "--check",
                          str(ROOT / "docs" / "hangbench.json")], capture_output=True, text=True, timeout=400,
                         env=job_env(), cwd=ROOT)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:] + res.stdout[-2000:]
    assert "| faults detected (recall) | 100% |" in res.stdout, res.stdout
    assert "| healthy jobs ended or alarmed | 0% |" in res.stdout, res.stdout
