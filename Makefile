# Each target sets itself up: a local virtual environment with the pinned CPU torch and this package.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup test lint demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check blackbox tests scripts
	$(VENV)/bin/ruff format --check blackbox tests scripts
	$(VENV)/bin/mypy

demo: $(STAMP)
	$(PY) scripts/demo.py

bench: $(STAMP)
	$(PY) scripts/bench_overhead.py
	$(PY) scripts/bench_collect.py

clean:
	rm -rf $(VENV) blackbox-runs .pytest_cache .mypy_cache .ruff_cache
