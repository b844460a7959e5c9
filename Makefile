# kvsplit: the two commands of the README.
#   make test   create/update .venv, install kvsplit with all extras and test deps, run the whole suite
#   make run    create/update .venv and run the main job
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvsplit-installed

.PHONY: test run venv

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# CPU torch unless a torch is already there (a GPU machine brings its own CUDA build).
	@$(PY) -c "import torch" 2>/dev/null || { echo "[make] installing CPU torch 2.13.0"; \
		$(PY) -m pip install --progress-bar off "torch==2.13.0"; }
	@echo "[make] installing kvsplit (editable) with all extras and the test tools; pip's progress follows"
	$(PY) -m pip install --progress-bar off -e ".[all,test]"
	@# compile the numba planner and plan-service parsers into numba's disk cache now (minutes on a fresh
	@# install), so `make run` and the tests load them in seconds; it prints each step
	$(PY) -m kvsplit.service.warmup
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

run: $(STAMP)
	$(VENV)/bin/kvsplit run
