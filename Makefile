# `make demo` and `make test` work on a fresh clone: each creates .venv if missing and installs
# the CPU build of torch that lies on this machine's disk before anything else, so pip never
# downloads a CUDA build. The install compiles the C hot path (stallscope/timeline/_native.c);
# a change to it rebuilds it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.stallscope-installed
PYTHON_TWIN_TESTS := tests/test_timeline_recorder.py tests/test_scope.py tests/test_bounded_memory.py tests/test_native.py tests/test_hooks_lightning.py tests/faults

.PHONY: demo test lint typecheck unit benchmarks clean

$(STAMP): pyproject.toml setup.py stallscope/timeline/_native.c
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

# the whole suite on the C hot path, then the tests of the timeline, the scope and the Lightning
# hooks again on its Python twin (what an install without a C compiler runs)
unit: $(STAMP)
	$(PY) -m pytest -q
	STALLSCOPE_NO_NATIVE=1 $(PY) -m pytest -q $(PYTHON_TWIN_TESTS)

test: lint typecheck unit

benchmarks: $(STAMP)
	$(PY) benchmarks/whatif.py
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info stallscope/*.egg-info stallscope/timeline/_native*.so
