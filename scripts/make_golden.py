"""Regenerate the golden bundles under tests/data/golden/ from the scenario gallery (scripts/scenarios/): each
scenario that leaves a bundle is run end to end under `blackbox run` (real torchrun, real gloo), its first
bundle kept, and the verdict the gallery expects of it written to expected.json. The bundles are redacted like
any other; they hold paths of the machine that made them.
Run with the project's venv: python scripts/make_golden.py [NAME...]"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "scenarios"))
from runner import SCENARIOS, run  # noqa: E402

OUT = ROOT / "tests" / "data" / "golden"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    names = sys.argv[1:] or [n for n, spec in SCENARIOS.items() if spec["verdict"] is not None]
    expected_path = OUT / "expected.json"
    table = json.loads(expected_path.read_text()) if expected_path.exists() else {}
    for name in names:
        t = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            outcome = run(name, Path(tmp, "run"), Path(tmp))
            if not outcome.bundles:
                raise SystemExit(f"{name}: no bundle (exit {outcome.exit_code}):\n{outcome.stderr[-2000:]}")
            shutil.copyfile(outcome.bundles[0], OUT / f"{name}.tar.gz")
        table[name] = SCENARIOS[name]["verdict"]
        print(f"{name}: {(OUT / f'{name}.tar.gz').stat().st_size} bytes, {time.monotonic() - t:.0f} s")
    expected_path.write_text(json.dumps(dict(sorted(table.items())), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
