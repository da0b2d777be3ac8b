# Each target sets itself up: a local virtual environment with the pinned CPU torch and this package.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup test test-fast lint docs demo bench bench-hangs clean browser services slurm

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# The HTML report test opens the page in headless Chromium; as root with apt, it is installed when missing
# (best effort: without it that test is skipped and says why).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		echo "installing chromium (Debian package) for the HTML report test" && \
		apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; } || true

# The metrics tests scrape blackbox with a real Prometheus server (and check the shipped rules with promtool); as
# root with apt, it is installed when missing (best effort: without it those tests are skipped and say why).
services:
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		command -v apt-get >/dev/null 2>&1 && echo "installing prometheus (Debian package) for the metrics tests" && \
		{ apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && \
		apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1; }; }; } || true

# The Slurm tests start a real Slurm of their own (tests/slurm_cluster.py); as root with apt, Debian's packages are
# installed when missing (best effort: without them those tests are skipped and say why).
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
slurm:
	@{ command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged; } >/dev/null 2>&1 || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		echo "installing Slurm (Debian packages) for the Slurm tests" && \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(SLURM_PACKAGES) >/dev/null 2>&1 || \
		{ apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y \
		--no-install-recommends $(SLURM_PACKAGES) >/dev/null 2>&1; }; }; } || true

# The suite in three runs: every test but those that need the machine (or a host-wide limit) to themselves,
# TEST_WORKERS at a time (pytest-xdist; most tests wait on their jobs, the tests of one module fixture or gallery row
# stay together: conftest.py, and a test whose group does not hold fails); then the quiet gallery (its 31 jobs take
# about 17 GB and both cores) and the stride's sub-10 ms steps, one after the other; then the Slurm cluster's module
# beside the throttled disks' as two pytest processes (a cluster's daemons that mostly wait, one light job at a time
# on a loop device: neither starves the other; beside the other tests' jobs Slurm's daemons answered late). Prints
# the 15 slowest, the time.
TEST_WORKERS ?= 4
PAIRED := tests/integration/test_slurm.py tests/integration/test_flush.py
test: $(STAMP) browser services slurm
	@start=$$(date +%s); \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not alone" --durations=15; first=$$?; \
	$(PY) -m pytest -m alone $(PAIRED:%=--ignore=%) --durations=3; second=$$?; \
	$(PY) -m pytest tests/integration/test_flush.py --durations=2 > .test-flush.log 2>&1 & flush=$$!; \
	$(PY) -m pytest tests/integration/test_slurm.py --durations=5; third=$$?; \
	wait $$flush; fourth=$$?; cat .test-flush.log; \
	echo "make test: $$(( $$(date +%s) - start )) s"; \
	[ $$first = 0 ] && [ $$second = 0 ] && [ $$third = 0 ] && [ $$fourth = 0 ]

# The unit tests alone: pure logic on golden and generated bundles, no torch import, no job started (under a minute).
test-fast: $(STAMP)
	$(PY) -m pytest tests/unit -q -n $(TEST_WORKERS) --dist loadgroup

# The parts of docs/ generated from the code (a unit test fails when they are stale).
docs: $(STAMP)
	$(PY) scripts/gen_docs.py

lint: $(STAMP)
	$(VENV)/bin/ruff check blackbox tests scripts
	$(VENV)/bin/ruff format --check blackbox tests scripts
	$(VENV)/bin/mypy

demo: $(STAMP)
	$(PY) scripts/demo.py

# The hang benchmark (about 25 minutes on 2 cores): every row of its matrix under blackbox, PyTorch alone and torchrun
# alone side by side; the result goes to docs/hangbench.json and its tables into docs/benchmarks.md.
bench-hangs: $(STAMP)
	$(PY) scripts/hangbench.py --out docs/hangbench.json
	$(PY) scripts/gen_docs.py

bench: $(STAMP)
	$(PY) scripts/bench_overhead.py
	$(PY) scripts/bench_output.py
	$(PY) scripts/bench_collect.py
	$(PY) scripts/bench_report.py
	$(PY) scripts/bench_coord.py

clean:
	rm -rf $(VENV) blackbox-runs .pytest_cache .mypy_cache .ruff_cache
