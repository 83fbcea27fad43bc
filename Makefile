# `make demo` and `make test` work on a fresh clone: each creates .venv if missing and installs
# the CPU build of torch that lies on this machine's disk before anything else, so pip never
# downloads a CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.stallscope-installed

.PHONY: demo test lint typecheck unit benchmarks clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_PIN)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/starved_loader.py

lint: $(STAMP)
	$(PY) -m ruff check stallscope tests examples benchmarks
	$(PY) -m ruff format --check stallscope

typecheck: $(STAMP)
	$(PY) -m mypy

unit: $(STAMP)
	$(PY) -m pytest -q

test: lint typecheck unit

benchmarks: $(STAMP)
	$(PY) benchmarks/whatif.py
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info stallscope/*.egg-info
