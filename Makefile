# Two entry points for a fresh machine (Python 3.11, pip, venv):
#   make demo   install everything into .venv and run the main job on the embedded default
#   make test   install everything into .venv and run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo test bench

$(BIN)/rlvr: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, from the CPU build: otherwise a dependency may pull a multi-GB CUDA build
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

install: $(BIN)/rlvr

demo: install
	$(BIN)/rlvr run --config configs/demo.yaml

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/rlvr bench dedup --sizes 100000,200000
