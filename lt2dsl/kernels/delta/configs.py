"""Autotune lists of the delta-rule kernels, and the autotuners the launchers call.

Lists are short on purpose: each config is a compile on the GPU. Every config was compiled for
sm_90 offline (`make sm90`, `aot_jobs.py`) and kept only without spills or with few, read from the
cubins' resource usage. Hopper miscompiles per config, so `test_gpu_every_autotune_config` runs
the GPU checks with each config forced (`forced_config`). Under the CPU interpreter there are no
autotuners: each launch runs the fixed config its launcher names.
"""

from __future__ import annotations

import triton

from lt2dsl.kernels.common.backend import autotuned_on_gpu, forced_autotune_config
from lt2dsl.kernels.delta.grad import delta_grad_cc_kernel, delta_grad_k_kernel
from lt2dsl.kernels.delta.helpers import DOT_IEEE
from lt2dsl.kernels.delta.kda_prep import kda_intra_fwd_kernel
from lt2dsl.kernels.delta.scan import delta_h_fwd_kernel, delta_hot_fwd_kernel, delta_o_fwd_kernel
from lt2dsl.kernels.delta.scan_bwd import (
    delta_dh_bwd_kernel,
    delta_du0_kernel,
    delta_w_kernel,
    delta_y_kernel,
)
from lt2dsl.kernels.delta.wy import delta_wy_rows_kernel


def _c(warps: int, stages: int, **meta) -> triton.Config:
    return triton.Config(meta, num_warps=warps, num_stages=stages)


# UT transform. 2 warps for 16-bit inputs only (`no_fp32_2warp`): its 16 x 16 substitution and
# block products leave wider programs mostly idle, and narrow ones fit more per SM (the autotuner
# picks 2 warps on the GPU for bf16).
WY_ROWS = [_c(4, 1), _c(8, 1), _c(2, 1)]
# Per-chunk C x C gradient kernel: two 64 x 64 fp32 accumulators.
GRAD_CC = [_c(4, 2, BV=32), _c(4, 2, BV=64)]
# Per-(K tile, chunk) gradient kernel, by key tile BK (`DeltaRecipe.grad_bk`): three [64, BK] fp32
# accumulators over the V loop. Offline sm_90, K = V = 128, bf16: BK 32 at 4 warps 140-148
# registers, no spills; BK 64 at 4 warps 245-254, 0-8 B of spills.
GRAD_K = {
    32: [_c(4, 2, BV=32), _c(4, 1, BV=32)],
    64: [_c(4, 2, BV=32), _c(4, 2, BV=64), _c(8, 2, BV=32)],
}
# KDA's preparation (2-D [16, BK] tiles, 255 registers each offline). 2 warps for 16-bit inputs:
# the [16, 16] dots are replicated across warps in their layout, so wider programs add no work
# per thread but fit fewer programs per SM.
KDA_PREP = [
    _c(8, 1, BK=32),
    _c(8, 1, BK=16),
    _c(4, 1, BK=32),
    _c(4, 1, BK=16),
    _c(2, 1, BK=16),
    _c(2, 1, BK=32),
]
# W recomputed for the backward, one chunk per program.
W = [_c(4, 1), _c(8, 1)]
# The split form's state scan, S `[K, BV]` in fp32 registers; the reverse scan fits the same tiles.
SCAN = [_c(4, 2, BV=64), _c(4, 2, BV=32), _c(8, 2, BV=64), _c(4, 1, BV=32)]
# The fused scan's state Sᵀ is the left operand of its dots, so its value tile is the MMA's M:
# BV 64 is one warpgroup (4 warps), BV 128 two (8 warps); below 64 Triton falls back to the
# pre-Hopper MMA. Offline (sm_90, K = V = 128, bf16) all are at 255 registers with 88-368 B of
# spills per thread; BV 64 at 4 warps unpipelined (520-552 B) is not in the list.
FUSED_SCAN = [_c(4, 2, BV=64), _c(8, 2, BV=64), _c(8, 2, BV=128), _c(4, 2, BV=32)]
# Chunk-parallel [64, BV] passes: the output, Pᵀ dO, Y = Tᵀ dU'.
CHUNK = [_c(4, 2, BV=64), _c(8, 2, BV=128), _c(8, 1, BV=64)]

# Kernels the GPU autotunes. The autotuner runs each several times on the same buffers, so none of
# them may read a buffer it writes (`test_delta_triton.test_autotuned_kernels_are_idempotent`).
AUTOTUNED_KERNELS: set = set()


def _tuned(kernel, configs, key, keep=None):
    """`autotuned_on_gpu`, recording the kernel in AUTOTUNED_KERNELS (on the CPU too)."""
    AUTOTUNED_KERNELS.add(kernel)
    return autotuned_on_gpu(kernel, configs, key, keep)


def no_fp32_2warp(config, args) -> bool:
    """2-warp configs only for 16-bit inputs: with fp32 (DOT_IEEE: tf32x3 dots) they spill kilobytes."""
    return config.num_warps > 2 or args.get("DOT") != DOT_IEEE


_KEY = ["H", "HV", "K", "V", "GATE"]
wy_rows = _tuned(delta_wy_rows_kernel, WY_ROWS, ["H", "HV", "K"], no_fp32_2warp)
grad_cc = _tuned(delta_grad_cc_kernel, GRAD_CC, _KEY)
grad_k = {bk: _tuned(delta_grad_k_kernel, c, _KEY) for bk, c in GRAD_K.items()}
kda_prep = _tuned(kda_intra_fwd_kernel, KDA_PREP, ["H", "HV", "K", "PART"], no_fp32_2warp)
w_bwd = _tuned(delta_w_kernel, W, ["H", "HV", "K", "GATE"], no_fp32_2warp)
h_fwd = _tuned(delta_h_fwd_kernel, SCAN, _KEY)
hot_fwd = _tuned(delta_hot_fwd_kernel, FUSED_SCAN, [*_KEY, "SAVE"])
o_fwd = _tuned(delta_o_fwd_kernel, CHUNK, _KEY, no_fp32_2warp)
dh_bwd = _tuned(delta_dh_bwd_kernel, SCAN, _KEY)
y_bwd = _tuned(delta_y_kernel, CHUNK, ["HV", "V"], no_fp32_2warp)
du0 = _tuned(delta_du0_kernel, CHUNK, _KEY, no_fp32_2warp)
TUNED = [
    t
    for t in (wy_rows, grad_cc, *grad_k.values(), kda_prep, w_bwd, h_fwd, hot_fwd, o_fwd, dh_bwd, y_bwd, du0)
    if t is not None
]
N_CONFIGS = max(map(len, (WY_ROWS, GRAD_CC, *GRAD_K.values(), KDA_PREP, W, SCAN, FUSED_SCAN, CHUNK)))


def forced_config(i: int):
    """Every autotuned delta-rule kernel runs config i of its list (see `forced_autotune_config`)."""
    return forced_autotune_config(TUNED, i)
