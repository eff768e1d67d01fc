# Entry points for a fresh machine (Python 3.11, pip, venv):
#   make demo        install everything into .venv and run the main job on the embedded default
#   make test        install everything into .venv and run the test suite (all but the `slow` tests)
#   make test-slow   the `slow` tests: long end-to-end runs (kills, Postgres workers, self-play); CI runs both
#   make mlflow-server  an MLflow server in .venv-mlflow of its own, for the tests of `rlvr track` (CI makes it)
#   make vllm-server  vLLM's CPU build in .venv-vllm of its own, for the `vllm` tests (CI makes it)
#   make test-vllm   the `vllm` tests: the project against real vLLM servers on loopback (skipped without .venv-vllm)
#   make older-transformers  transformers 5.17 in build/, for the GPU check's test on an older API (CI makes it)
#   make bench-refresh  re-run every saved benchmark result measured on older code (`rlvr bench stale`), render the docs
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MLFLOW_VENV ?= .venv-mlflow
OLDER_TRANSFORMERS ?= build/transformers-older
VLLM_VENV ?= .venv-vllm

.PHONY: install demo test test-slow test-vllm bench bench-refresh mlflow-server vllm-server older-transformers

$(BIN)/rlvr: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, from the CPU build: otherwise a dependency may pull a multi-GB CUDA build
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

install: $(BIN)/rlvr

# Its own environment: MLflow's pins (FastAPI, SQLAlchemy, ...) never meet the platform's, which only speaks to the
# server over HTTP. tests/tasks/interop/test_tracking.py starts it (and skips its server tests, saying so, without it).
$(MLFLOW_VENV)/bin/mlflow: requirements/mlflow-server.txt
	$(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install --quiet -r requirements/mlflow-server.txt
	touch $@

mlflow-server: $(MLFLOW_VENV)/bin/mlflow

# vLLM's CPU build, never in .venv (its FastAPI pin clashes with Prefect's): the platform speaks to it over HTTP only.
# torch first, the local CPU build; then every pinned package without dependency resolution, which would pull the
# torchvision/torchaudio/torchcodec builds that break transformers beside that torch (requirements/vllm-server.txt).
# The `vllm` tests (policy/vllm_servers.py starts them) and infra/vllm/serve.sh run servers from it.
$(VLLM_VENV)/bin/python: requirements/vllm-server.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet "torch==2.13.0"
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -r requirements/vllm-server.txt
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, transformers" \
	  || { echo "make vllm-server: vLLM does not import in $(VLLM_VENV)" >&2; exit 1; }
	touch $@

vllm-server: $(VLLM_VENV)/bin/python

# Beside the platform, never in it: tests/test_gpu_check.py puts it ahead of a GPU host's packages for one test
# (and skips that test, saying so, without it).
$(OLDER_TRANSFORMERS)/transformers: requirements/transformers-older.txt $(BIN)/rlvr
	rm -rf $(OLDER_TRANSFORMERS)
	$(BIN)/pip install --quiet --no-warn-conflicts --target $(OLDER_TRANSFORMERS) -r requirements/transformers-older.txt
	touch $@

older-transformers: $(OLDER_TRANSFORMERS)/transformers

demo: install
	$(BIN)/rlvr run --config configs/demo.yaml

# Each says what it runs, then how long it took; pytest's exit status is the target's.
test: install
	@echo "make test: the suite without the slow and vllm tests (pytest -m 'not slow and not vllm'; make test-slow and make test-vllm run those)"
	@start=$$(date +%s); $(BIN)/python -m pytest -m "not slow and not vllm"; status=$$?; \
	  echo "make test: $$(( ($$(date +%s) - start) / 60 )) min $$(( ($$(date +%s) - start) % 60 )) s, exit status $$status"; \
	  $(BIN)/rlvr bench stale || true; \
	  exit $$status

test-slow: install
	@echo "make test-slow: the slow tests only (pytest -m slow): kills, Postgres-backed workers, self-play runs"
	@start=$$(date +%s); $(BIN)/python -m pytest -m slow; status=$$?; \
	  echo "make test-slow: $$(( ($$(date +%s) - start) / 60 )) min $$(( ($$(date +%s) - start) % 60 )) s, exit status $$status"; \
	  exit $$status

test-vllm: install
	@echo "make test-vllm: the vllm tests only (pytest -m vllm): real vLLM servers from $(VLLM_VENV) (make vllm-server)"
	@start=$$(date +%s); $(BIN)/python -m pytest -m vllm -n 0; status=$$?; \
	  echo "make test-vllm: $$(( ($$(date +%s) - start) / 60 )) min $$(( ($$(date +%s) - start) % 60 )) s, exit status $$status"; \
	  exit $$status

bench: install
	$(BIN)/rlvr bench dedup --sizes 100000,200000

# Information, never a failure: figures carry their commit and date. This re-runs the stale ones one at a time.
bench-refresh: install
	$(BIN)/python -m bench.stale --refresh
