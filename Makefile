# kvsplit: the two commands of the README.
#   make test       create/update .venv, install kvsplit with all extras and test deps, ruff (lint + format
#                   check), then the whole suite
#   make run        create/update .venv and run the main job
#   make test-fast  the planner and plan-service tests only (no interpreter kernels, browser, PostgreSQL or
#                   server subprocesses): about 3 minutes on 2 cores, for the edit-test loop
#   make docs       regenerate docs/reference/ from the code (tests/service/test_docgen.py fails when it is stale)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvsplit-installed

.PHONY: test test-fast lint run venv docs

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch from the package index unless one is there (PyPI: the CUDA build; a CPU build: docs/getting-started.md)
	@$(PY) -c "import torch" 2>/dev/null || { echo "[make] installing torch 2.13.0 as your package index serves it (PyPI on Linux: the CUDA build; for the CPU build see docs/getting-started.md)"; \
		$(PY) -m pip install --progress-bar off "torch==2.13.0"; }
	@echo "[make] installing kvsplit (editable) with all extras and the test tools; pip's progress follows"
	$(PY) -m pip install --progress-bar off -e ".[all,test]"
	@# compile the numba planner and plan-service parsers into numba's disk cache now (minutes on a fresh
	@# install), so `make run` and the tests load them in seconds; it prints each step
	$(PY) -m kvsplit.service.warmup
	@touch $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: lint
	$(PY) -m pytest -q

# planner tests (tests/kernels without the Triton-interpreter kernel tests) and plan-service tests (tests/service
# without the browser, schemathesis and the tests that start servers or CLI processes)
FAST_IGNORE := tests/kernels/test_decode.py tests/kernels/test_decode_gpu.py tests/kernels/test_device_plan.py \
	tests/kernels/test_heads_per_tile.py tests/kernels/test_next_item.py tests/kernels/test_wrapper.py \
	tests/service/test_client.py tests/service/test_dashboard_browser.py tests/service/test_main_job.py \
	tests/service/test_schemathesis.py tests/service/test_settings_env.py

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not gpu and not browser and not postgres" tests/kernels tests/service \
		$(addprefix --ignore=,$(FAST_IGNORE))

run: $(STAMP)
	$(VENV)/bin/kvsplit run

docs: $(STAMP)
	$(PY) -m kvsplit.service.docgen
