# lt2dsl developer commands. `make help` lists them.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
EXAMPLE ?= examples/lt2_hybrid_gdn_dsa.lt2
# Pinned CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
TRITON  ?= triton==3.9.0

.PHONY: help demo setup test test-fast lint goldens bench-gpu clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(BIN)/.stamp: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q $(TRITON) -e '.[dev]'
	touch $@

setup: $(BIN)/.stamp  ## create .venv with pinned CPU torch, triton and the dev tools

demo: setup  ## set up, then compile an example with its estimate report
	$(BIN)/lt2dsl check examples/*.lt2
	$(BIN)/lt2dsl compile $(EXAMPLE) --estimate

test: setup  ## the whole test suite (CPU; Triton kernels run under TRITON_INTERPRET=1)
	$(BIN)/python -m pytest -q -n 2 tests

test-fast: setup  ## everything but the slow tests
	$(BIN)/python -m pytest -q -n 2 -m "not slow" tests

lint: setup  ## ruff
	$(BIN)/ruff check .

goldens: setup  ## rewrite golden files (review the diff afterwards)
	LT2_UPDATE_GOLDENS=1 $(BIN)/python -m pytest -q tests

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
