# lt2dsl developer commands. `make help` lists them.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
EXAMPLE ?= examples/lt2_hybrid_gdn_dsa.lt2
# Pinned CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
TRITON  ?= triton==3.9.0
# what `make test` runs, e.g. TESTS=tests/kernels/test_aot.py
TESTS   ?= tests
# The Triton the GPU machine's PyTorch ships (torch 2.11): `make test` compiles every kernel for
# sm_90 with it (tests/kernels/test_aot.py), from its own `pip --target` folder, so the CPU tests
# keep TRITON's interpreter. The one place this version is set.
GPU_TRITON ?= 3.6.0
GPU_TRITON_DIR := .tcache/triton-$(GPU_TRITON)

.PHONY: help demo setup test test-fast lint goldens bench-gpu clean gpu-triton sm90

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

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

$(GPU_TRITON_DIR)/.stamp: | $(BIN)/.stamp
	$(BIN)/pip install -q --no-deps --target $(GPU_TRITON_DIR) triton==$(GPU_TRITON)
	touch $@

gpu-triton: $(GPU_TRITON_DIR)/.stamp  ## install the GPU's Triton (GPU_TRITON) into .tcache for the sm_90 check

test: setup gpu-triton  ## the whole suite (CPU; kernels under TRITON_INTERPRET=1, and compiled for sm_90)
	$(BIN)/python -m pytest -q -n 2 --gpu-triton=$(GPU_TRITON_DIR) $(TESTS)

sm90: setup gpu-triton  ## compile every Triton kernel for sm_90 with the GPU's Triton (no GPU needed)
	PYTHONPATH=$(GPU_TRITON_DIR):. $(BIN)/python -m tests.kernels.aot_check --workers 2 --cache .tcache/aot

test-fast: setup  ## everything but the slow tests
	$(BIN)/python -m pytest -q -n 2 -m "not slow" tests

lint: setup  ## ruff
	$(BIN)/ruff check .

goldens: setup  ## rewrite golden files (review the diff afterwards)
	LT2_UPDATE_GOLDENS=1 $(BIN)/python -m pytest -q tests

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
