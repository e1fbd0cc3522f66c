"""Triton building blocks of the chunked kernels (the decay family and the blocked Toeplitz
product): tile and vector loads and stores, `mma`, recorded autotuners (`tuned`, `force_config`).

Tiles are loaded with plain pointer arithmetic and masks (no block pointers: Triton 3.9 removed
them, and the GPU's Triton 3.6 has them, so this is the one form both accept). A transposed operand is always
*loaded* transposed from global memory; no kernel calls `tl.trans` on a value that came out of a
`tl.dot` (that pattern miscompiles on Hopper with Triton 3.4–3.7.0, /work/shared/bench/README.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import triton_interpreting
from .tl_util import NO_CACHE_MODIFIER
from .tl_util import cast as cast  # re-exported: the decay kernels import it from here

# Triton 3.9's CPU interpreter gets bf16 wrong in two ways the GPU does not: tl.dot multiplies bf16
# tiles as raw integers (off by ~1e10), and fp32 → bf16 casts truncate instead of rounding to
# nearest even (twice the GPU's error, biased). Under the interpreter `mma` runs on fp32 copies
# (what the GPU's bf16 MMA with fp32 accumulation computes) and `cast` rounds like the GPU.
INTERPRET = tl.constexpr(triton_interpreting())


# every autotuned decay kernel, so GPU tests can run each candidate config (`force_config`)
AUTOTUNED: list = []


def device_fn(fn):
    """`triton.jit` for a helper called from kernels; a plain function under the interpreter.

    The interpreter re-patches `triton.language` on every call of a jitted helper (milliseconds each),
    while a plain Python function runs the same tl calls inside the kernel's already-patched scope.
    """
    return fn if triton_interpreting() else triton.jit(fn)


def autotune_configs(configs: list[triton.Config]) -> list[triton.Config]:
    """The candidates on a GPU; the first one only under the CPU interpreter (nothing to time)."""
    return configs[:1] if triton_interpreting() else configs


def config_table(keys: tuple[str, ...], rows: list[tuple[int, ...]]) -> list[triton.Config]:
    """`triton.Config`s from table rows (the values of `keys`, then warps and stages)."""
    return [triton.Config(dict(zip(keys, r[:-2])), num_warps=r[-2], num_stages=r[-1]) for r in rows]


def tuned(configs: list[triton.Config], key: list[str], prune=None, reset_to_zero=None):
    """`triton.autotune` over `configs` (one under the interpreter), recorded in AUTOTUNED.

    `prune(config, args)` -> bool drops a candidate for the launch's arguments (constexprs
    included); a launch never ends up with no candidate (a pinned one is kept). `reset_to_zero`
    names the outputs a kernel accumulates into (atomics): zeroed before each timing run, so the
    autotuner's repeated launches do not add up in them."""

    def early_prune(cands, named_args, **kwargs):
        keep = [c for c in cands if prune(c, {**named_args, **kwargs})]
        return keep or cands

    def wrap(fn):
        by = None if prune is None else {"early_config_prune": early_prune}
        at = triton.autotune(
            configs=autotune_configs(configs), key=key, prune_configs_by=by, reset_to_zero=reset_to_zero
        )(fn)
        at.all_configs = list(at.configs)
        AUTOTUNED.append(at)
        return at

    return wrap


# The configs of the chunked linear-attention kernels (simple_gla, mlstm; gla's kernels follow the
# same notes with a config list of their own). Hopper (sm_90, Triton 3.6) notes, every config: no
# tl.trans of any value (transposed operands are loaded transposed), so the accumulator-transpose
# miscompile of Triton 3.4–3.7.0 cannot hit; tiles are powers of two ≥ 16. A head dim that is not a
# multiple of the tile is a masked pointer load; the README's sm_90 crash for odd head dims in
# 16-bit backward kernels is not ruled out (the GPU tests use 64 and 128). num_warps=4 failed on
# sm_90 in the peer's delta-rule WY backward (a triangular solve), a pattern absent here. Every
# config is checked on the H200 by `test_gpu_every_autotune_config` (force_config).
CHUNK_CONFIGS = [
    triton.Config({}, num_warps=4, num_stages=2),
    triton.Config({}, num_warps=8, num_stages=3),
]


def force_config(index: int | None) -> None:
    """Pin every autotuned decay kernel to its `index`-th candidate (modulo its count); None restores."""
    for at in AUTOTUNED:
        at.configs = list(at.all_configs) if index is None else [at.all_configs[index % len(at.all_configs)]]
        at.cache.clear()


def max_configs() -> int:
    return max((len(at.all_configs) for at in AUTOTUNED), default=1)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs need IEEE dots (TF32 would miss the 1e-4 tolerance); 16-bit inputs ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"


def block(n: int, cap: int = 64) -> int:
    """Tile width for a head dim: a power of two in [32, cap].

    At least 32, not tl.dot's 16: on the H200 (Triton 3.6) bf16 simple_gla with V = 16 (a 16-wide
    value tile) gave a 71% wrong output (RetNet decay) and an illegal memory access (no decay),
    while fp32 at the same shapes and every 32-wide case ran right; the delta-rule scans met the
    same with 16-row key tiles. Columns past the head dim are masked loads of zeros.
    """
    return min(cap, max(32, triton.next_power_of_2(n)))


@device_fn
def mma(a, b, PREC: tl.constexpr):
    """tl.dot(a, b) with fp32 accumulation; `PREC` is "ieee" for fp32 inputs."""
    if INTERPRET:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PREC)
    return out


@device_fn
def load_tile(
    ptr, r0, c0, R, C, sr, sc, BR: tl.constexpr, BC: tl.constexpr, CACHE: tl.constexpr = NO_CACHE_MODIFIER
):
    """`[BR, BC]` tile at (r0, c0) of an R × C matrix with strides (sr, sc), zeros outside.

    CACHE is the load's cache modifier (`tl_util.NO_CACHE_MODIFIER`: none)."""
    rows = r0 + tl.arange(0, BR)
    cols = c0 + tl.arange(0, BC)
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    return tl.load(ptr + rows[:, None] * sr + cols[None, :] * sc, mask=mask, other=0.0, cache_modifier=CACHE)


@device_fn
def load_tile_apart(ptr, r0, c0, R, C, sr, sc, BR: tl.constexpr, BC: tl.constexpr):
    """`load_tile` as a load of its own, for the elementwise use of a tile that also feeds `tl.dot`.

    A dot operand with a second, non-dot use gets one shared buffer from Triton's pipeliner at 2
    stages, refilled while asynchronous wgmma dots still read it (a race bench/ttgir_checks.py
    flags). An identical second `load_tile` is merged back into the first by CSE (seen in the sm_90
    TTGIR); the cache modifier keeps this one apart. Its read hits L2.
    """
    return load_tile(ptr, r0, c0, R, C, sr, sc, BR, BC, ".cg")


@device_fn
def store_tile(ptr, val, r0, c0, R, C, sr, sc, BR: tl.constexpr, BC: tl.constexpr):
    """Store a `[BR, BC]` tile at (r0, c0) of an R × C matrix, dropping what falls outside."""
    rows = r0 + tl.arange(0, BR)
    cols = c0 + tl.arange(0, BC)
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    tl.store(ptr + rows[:, None] * sr + cols[None, :] * sc, cast(val, ptr.dtype.element_ty), mask=mask)


@device_fn
def load_vec(ptr, r0, R, sr, BR: tl.constexpr):
    """`[BR]` strided vector starting at r0, zeros past R."""
    rows = r0 + tl.arange(0, BR)
    return tl.load(ptr + rows * sr, mask=rows < R, other=0.0)


@device_fn
def store_vec(ptr, val, r0, R, sr, BR: tl.constexpr):
    rows = r0 + tl.arange(0, BR)
    tl.store(ptr + rows * sr, cast(val, ptr.dtype.element_ty), mask=rows < R)
