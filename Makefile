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
# What the GPU machine's Python 3.12 lacks for lt2dsl (`make smoke-wheels` fetches them into .whl/)
SMOKE_WHEELS := lark==1.3.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing-extensions==4.16.0 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 \
  pygments==2.21.0 networkx==3.6.1
# The peer the GPU benchmarks run beside ours (decode, training): flash-linear-attention ("fla")
PEER_WHEELS := flash-linear-attention==0.6.0 fla-core==0.6.0
WHEEL_PLATFORMS := --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64

.PHONY: help demo setup test test-fast lint goldens bench-gpu clean gpu-triton sm90 smoke-wheels gpu-smoke ab-base

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

smoke-wheels: setup  ## download into .whl/ the wheels the GPU machine lacks, and the peer's (carry .whl there)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: $(WHEEL_PLATFORMS) -d .whl $(SMOKE_WHEELS) $(PEER_WHEELS)

gpu-smoke:  ## on the GPU machine: every example and the 12-layer GDN model (bench/gpu_smoke.py)
	@if ls .whl/*.whl > /dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps --no-compile \
	  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; fi
	PYTHONPATH=/tmp/site:. python3 bench/gpu_smoke.py $(if $(OUT),--json $(OUT)/gpu_smoke.json)

ab-base:  ## archive COMMIT's lt2dsl/ into .ab_base/ for bench/decode_ab.py (carry .ab_base to the GPU)
	@test -n "$(COMMIT)" || { echo "usage: make ab-base COMMIT=<commit>"; exit 2; }
	rm -rf .ab_base.tmp && mkdir -p .ab_base.tmp && git archive $(COMMIT) lt2dsl | tar -x -C .ab_base.tmp
	git rev-parse --short $(COMMIT) > .ab_base.tmp/COMMIT && rm -rf .ab_base && mv .ab_base.tmp .ab_base

test-fast: setup  ## everything but the slow tests
	$(BIN)/python -m pytest -q -n 2 -m "not slow" tests

lint: setup  ## ruff
	$(BIN)/ruff check .

goldens: setup  ## rewrite golden files (review the diff afterwards)
	LT2_UPDATE_GOLDENS=1 $(BIN)/python -m pytest -q tests

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
