"""Host-side launchers of the delta-rule Triton kernels: buffers, grids, autotune configs.

Forward (chunked): `delta_wy_rows_kernel` (or KDA's `kda_intra_fwd_kernel`) prepares T = (I + A)^{-1}
per chunk, then `delta_split.delta_h_fwd_kernel` scans the chunks and `delta_o_fwd_kernel` writes
the output per chunk (the earlier fused scan and register-only UT transform, slower on the H200,
were removed after the fourth session's measurements; BENCHMARKS.md). For a scalar gate `FUSED_O`
(the default, for inference and training) runs `delta_hot_fwd_kernel` instead, the scan forming
the output itself with the state held transposed (`delta_ho_fwd_kernel` untransposed, with
LT2_DELTA_TSTATE=0).
Backward: the W-based reverse scan of `delta_split` (or, with LT2_DELTA_WBWD=0, the fused
`delta_state_bwd_kernel`), then the per-chunk gradient kernels (`delta_grad`, plus KDA's
`kda_grad_intra_kernel`). Decode: `delta_recurrent_kernel`.

Autotune lists are short on purpose (each config is a compile on the GPU). Hopper miscompiles per
config (/work/shared/bench/README.md): no kernel transposes a `tl.dot` result, so the Triton
3.4–3.7.0 sm_90 "trans of a dot accumulator cast to 16-bit at BK = 64" bug has no site in any
config; the `num_warps=4` delta-rule WY-backward bug was in a peer kernel we do not have, but the
4-warp configs below are the ones it would concern, so `test_gpu_every_autotune_config` checks
every config against float64 on the GPU (`forced_config`). Under the CPU interpreter one fixed
config runs.
"""

from __future__ import annotations

import os
from itertools import pairwise

import torch
import triton
import triton.language as tl

from lt2dsl.kernels.common.backend import autotuned_on_gpu, forced_autotune_config, triton_interpreting
from lt2dsl.kernels.common.tl_util import DIAG_SPAN, diag_span
from lt2dsl.kernels.delta.grad import (
    delta_grad_cc_kernel,
    delta_grad_final_kernel,
    delta_grad_k_kernel,
)
from lt2dsl.kernels.delta.helpers import DOT_IEEE, DOT_INTERP, DOT_NATIVE
from lt2dsl.kernels.delta.kda_prep import kda_intra_fwd_kernel
from lt2dsl.kernels.delta.scan import (
    delta_dh_bwd_kernel,
    delta_dht_bwd_kernel,
    delta_du0_kernel,
    delta_h_fwd_kernel,
    delta_ho_fwd_kernel,
    delta_hot_fwd_kernel,
    delta_o_fwd_kernel,
    delta_wu_fwd_kernel,
    delta_y_kernel,
)
from lt2dsl.kernels.delta.state import delta_state_bwd_kernel
from lt2dsl.kernels.delta.wy import delta_qk_fwd_kernel, delta_wy_rows_kernel

BT = 64
GATE_IDS = {"none": 0, "scalar": 1, "channel": 2}
# Tests set this to fill every buffer the kernels write with NaN first, so an element a kernel
# forgets to write fails the comparison instead of passing on leftover memory.
POISON = os.environ.get("LT2_POISON", "0") == "1"
BF16_DOTS = os.environ.get("LT2_DELTA_BF16_DOTS", "0") == "1"


def empty(like: torch.Tensor, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.empty on `like`'s device (NaN-filled when POISON is set)."""
    t = torch.empty(shape, dtype=dtype or like.dtype, device=like.device)
    return t.fill_(float("nan")) if POISON else t


# Configs were chosen by compiling for sm_90 offline and reading registers / spills from the
# cubins (`cuobjdump --dump-resource-usage`): only configs without or with minimal spills remain.
# The reverse state scan: one program per (V tile, sequence x head); BV = 16 gives B*HV*V/16
# programs (512 at B=4, H=16, V=128, about two per SM) and is the spill-free size at 4 warps.
_STATE_CONFIGS = [
    triton.Config({"BV": 16}, num_warps=4, num_stages=2),
    # (BV 16 at 8 warps is gone: on the H200 it gave KDA's forward output 31% wrong in fp32, wrong
    # dk in bf16 for all three rules, and illegal memory accesses in fp32; every other config here
    # was right on the same shapes. BENCHMARKS.md, third session.)
    triton.Config({"BV": 32}, num_warps=8, num_stages=2),
    # unpipelined: 37-41 KB of shared memory at K = V = 128 instead of ~137 KB (one program per
    # SM), so two programs (the register limit at 4 warps) share an SM and hide each other's latency
    triton.Config({"BV": 16}, num_warps=4, num_stages=1),
]
# Per-chunk C x C gradient kernel: two 64 x 64 fp32 accumulators.
_CC_CONFIGS = [
    triton.Config({"BV": 32}, num_warps=4, num_stages=2),
    triton.Config({"BV": 64}, num_warps=4, num_stages=2),
]
# Per-(K tile, chunk) gradient kernel: three [64, BK] fp32 accumulators over the V loop, folded
# into two before the intra-chunk products. Lists per key tile BK (offline sm_90, K = V = 128,
# bf16, registers / spills per thread): BK 32 at 4 warps 140-148 / 0; BK 64 at 4 warps 245-254 / 0
# (8 B at BV 64); BK 128 at 8 warps 255 / 32-88 B. fp32 inputs (tf32x3 dots) keep BK 32: at BK 64
# they spill 368 B, at 128 896 B.
_GRAD_CONFIGS_BY_BK = {
    32: [
        triton.Config({"BV": 32}, num_warps=4, num_stages=2),
        triton.Config({"BV": 32}, num_warps=4, num_stages=1),
    ],
    64: [
        triton.Config({"BV": 32}, num_warps=4, num_stages=2),
        triton.Config({"BV": 64}, num_warps=4, num_stages=2),
        triton.Config({"BV": 32}, num_warps=8, num_stages=2),
    ],
    128: [
        triton.Config({"BV": 32}, num_warps=8, num_stages=2),
        triton.Config({"BV": 64}, num_warps=8, num_stages=2),
    ],
}
_PREP_CONFIGS = [triton.Config({}, num_warps=4, num_stages=1)]
# The key tile of the per-(K tile, chunk) gradient kernel for 16-bit inputs with a scalar or no
# gate (`grad_bk`); KDA's per-channel gates and fp32 inputs run FP32_GRAD_BK. Until the
# twentieth session every case ran BK 32: four programs per 128-wide key re-read dO, U', Y and
# the two [64, 64] fp32 scratch matrices, and on the H200 the kernel was bound by its own
# instruction stream (23% SM throughput, 28% DRAM; 1.47 ms of DeltaNet's 3.3 ms backward).
GRAD_BK = int(os.environ.get("LT2_DELTA_GRAD_BK", "64"))
FP32_GRAD_BK = 32
# KDA's intra-chunk gradient kernel (read-modify-writes dq, dk, dg: not autotuned). Offline sm_90
# compiles at K = 128: BK 32 at 4 warps spills 72 B per thread; BK 16 spills 520-780 B.
KDA_BK, KDA_WARPS = 32, 4
# Tried on the H200 (fifth session) and dropped: BK = 64 at 8 warps for the per-(K tile, chunk)
# gradient kernel (half its reads of dO, U', Y; GDN fwd+bwd 4.762 ms against 4.74 without it) and
# 3-stage pipelined scan configs (GDN forward 1.235 ms against 1.226).
# KDA's intra-chunk forward (2-D [16, BK] tiles). Offline sm_90 compiles at K = 128 (255 registers
# each; spills per thread): `make sm90` (delta_aot_jobs.py). Each config is checked on the
# H200 by the forced-config test (`test_gpu_every_autotune_config`).
_KDA_FWD_CONFIGS = [
    triton.Config({"BK": 32}, num_warps=8, num_stages=1),
    triton.Config({"BK": 16}, num_warps=8, num_stages=1),
    triton.Config({"BK": 32}, num_warps=4, num_stages=1),
    triton.Config({"BK": 16}, num_warps=4, num_stages=1),
    # 2 warps, 16-bit inputs and the split halves only (`_kda_narrow`): the [16, 16] dots are
    # replicated across warps in their layout, so wider programs add no work per thread but fit
    # fewer programs per SM (the H200 picks 2 warps for both halves). Offline sm_90 at K = 128: the halves
    # (LT2_KDA_SPLIT) 214-255 registers, 0-72 B of spills; the single kernel 536-648 B
    triton.Config({"BK": 16}, num_warps=2, num_stages=1),
    triton.Config({"BK": 32}, num_warps=2, num_stages=1),
]
if os.environ.get("LT2_DELTA_CANDIDATES", "0") == "1":
    # KDA's Aqk half at 1 warp: its 16 x 16 dots are replicated across warps, so one warp does the
    # same work as two with half the threads per program. On the H200 the KDA forward took 2.761 ms
    # with it in the list against 2.759 without (fourteenth session, call 2; thirteenth, call 3):
    # no gain, so it stays a candidate only.
    _KDA_FWD_CONFIGS.append(triton.Config({"BK": 16}, num_warps=1, num_stages=1))
KDA_FWD_BK, KDA_FWD_WARPS = 32, 8
# The diagonal-block span of KDA's intra-chunk kernels (chunk_intra.py, chunk_grad.py; the rule is
# tl_util.diag_span); a module attribute so tests can force either form.
KDA_DIAG_SPAN = DIAG_SPAN


def kda_diag_span(dtype: torch.dtype) -> float:
    """KDA_DIAG_SPAN for inputs of `dtype`: the dots take fp16 operands with LT2_DELTA_BF16_DOTS."""
    return diag_span(compute_dtype(dtype) == tl.float16, KDA_DIAG_SPAN)


# The forward scan (`delta_split`) holds S `[K, BV]` in fp32 registers: BV 64 is the peer's tile
# (two programs per head at V = 128).
# LT2_DELTA_WU=1: W = T Diag(β)(K ⊙ γ) and U = T Diag(β) V per chunk first, stored in the input
# dtype, and a two-dot scan (U' = U − W S, the state update) as the peer's. Off by default: on the
# H200 (fourth session) its W/U kernel cost 334 µs and the GDN forward took 1.421 ms against 1.226
# with the scan applying T itself (three dots, fp32-grade U'). Emulating the GPU's roundings at
# T = 8192 it is also less precise (output 2.6e-3, final state 1.8e-3 relative RMS against float64,
# against 0.9e-3 and 0.3e-3), both inside the 1e-2 budget of 16-bit inputs.
WU = os.environ.get("LT2_DELTA_WU", "0") == "1"
# The W-based backward (default; `delta_split`: Pᵀ dO for all chunks in parallel, a reverse scan
# with two dots on its sequential path, dS ← Diag(γ_C) dS + (sQ ⊙ γ)ᵀ dO − Wᵀ dU', W recomputed per
# chunk, Y = Tᵀ dU' formed per chunk afterwards). On the H200 GDN's forward+backward took 4.76 ms
# with it against 5.27 with the fused reverse scan, and it passed the GPU tests of GDN and DeltaNet
# (full sizes, bf16 and fp32, the forced autotune configs; fifth session). Its first version wrote
# Y in place, which the autotuner's repeated runs corrupted; `test_autotuned_kernels_are_idempotent`
# guards that. LT2_DELTA_WBWD=0 selects the fused reverse scan, which reads the scores P the forward
# then keeps.
WBWD = os.environ.get("LT2_DELTA_WBWD", "1") == "1"


# The output formed inside the state scan (scalar gate: GDN and DeltaNet) instead of a
# chunk-parallel output kernel reading back the per-chunk states and U' (in fp32): for inference no
# state or U' goes through memory (nor is a [chunks, HV, K, V] buffer allocated), and training
# stores them in the input dtype only. The scan is bound by each program's own instruction stream
# (one program per SM at B=4, H=16, V=128), so the output's dots cost it about what the output
# kernel cost, and the fusion alone bought 2-3% of the forward (fourteenth session: fused scan 824
# µs against scan 516 + output 346). With the state held transposed (`delta_hot_fwd_kernel`, TSTATE)
# the state and U' are left operands, which Hopper's MMA reads from registers, so they no longer go
# through shared memory on every chunk. On the H200 (fifteenth session, B=4, T=8192, H=16, D=128,
# bf16, BENCHMARKS.md) GDN's forward took 1.083 ms against 1.138 split (1.100 for the untransposed
# fused scan), fwd+bwd with training fused too 4.481 against 4.577; DeltaNet 1.060 against 1.120 and
# 4.339 against 4.428. Checked there against float64 for inference (every case: 20 passed) and for
# training with LT2_DELTA_FUSED_O=1 (44 passed, every autotune config forced; 10 fp32 forcings
# skipped as not fitting, which the autotuner skips too), and in the sixteenth session the eight
# T = 8192 training cases (GDN and DeltaNet, D 64 and 128, bf16 and fp32) passed with it too. So
# the scan forms the output for training as well by default (=1); =inference fuses only when no
# input needs a gradient (the fifteenth session's default), =0 never. LT2_DELTA_TSTATE=0 runs the
# untransposed fused scan (`delta_ho_fwd_kernel`).
def _fused_o_switch(value: str) -> bool | None:
    modes = {"1": True, "0": False, "inference": None}
    if value not in modes:
        raise ValueError(f"LT2_DELTA_FUSED_O={value!r}: expected one of {', '.join(modes)}")
    return modes[value]


FUSED_O = _fused_o_switch(os.environ.get("LT2_DELTA_FUSED_O", "1"))
# The gated fused scan runs one program per (64-wide value tile, sequence x head) and carries the
# output's dots on its sequential path; with fewer programs than half the SMs the split form's
# chunk-parallel output kernel wins. On the H200 (twentieth session, B=1, T=32768, H=16, D=128,
# bf16: 32 programs on 132 SMs) GDN's forward took 2.813 ms fused against 2.101 split and fwd+bwd
# 7.560 against 6.975, while at B=4, T=8192 (128 programs) fused is ahead (1.075 against ~1.10).
# DeltaNet's gate-free scan was ahead fused at both (2.037 against 2.081 ms, 6.609 against 6.788),
# so it keeps fusing. 0 turns the rule off (fused whenever FUSED_O says so).
FUSED_MIN_SM_FRACTION = float(os.environ.get("LT2_DELTA_FUSED_MIN_SM_FRACTION", "0.5"))


def sm_count(device: torch.device) -> int | None:
    """Streaming multiprocessors of a CUDA device; None elsewhere (the interpreter)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


def gated_scan_fills(programs: int, sms: int | None) -> bool:
    """Whether the gated fused scan's `programs` occupy enough of `sms` to beat the split form."""
    return sms is None or programs >= FUSED_MIN_SM_FRACTION * sms


TSTATE = os.environ.get("LT2_DELTA_TSTATE", "1") == "1"
# The W-based reverse scan with the state gradient held transposed (`delta_dht_bwd_kernel`), the
# forward's trick for the backward (scalar gate): opt-in until the H200 has checked and timed it.
TSTATE_BWD = os.environ.get("LT2_DELTA_TSTATE_BWD", "0") == "1"
# Y = Tᵀ dU' formed by the C x C gradient kernel (which reads Y anyway) instead of its own pass
# (`delta_y_kernel`: 228 µs of GDN's fwd+bwd on the H200, fourteenth session): one fp32 pass
# over dU' and Y fewer. Opt-in until the H200 has checked and timed it.
Y_IN_CC = os.environ.get("LT2_DELTA_Y_IN_CC", "0") == "1"
# DeltaNet's transposed fused scan without the gate code (GATE 0: no gate loads, exponentials or
# factors); LT2_DELTA_NOGATE=0 runs it as the scalar-gate scan with b = 0, as before.
NOGATE = os.environ.get("LT2_DELTA_NOGATE", "1") == "1"
# Y = Tᵀ dU' formed by the W-based reverse scan as it produces dU', off its dependency chain,
# instead of by `delta_y_kernel`'s pass over dU' and T afterwards. Opt-in until the H200 has
# timed it (it adds T's load and a dot to each step of the sequential scan).
Y_IN_SCAN = os.environ.get("LT2_DELTA_Y_IN_SCAN", "0") == "1"
# Pᵀ dO formed by the W-based reverse scan from the tiles it loads anyway (DeltaNet and GDN),
# instead of by `delta_du0_kernel`'s chunk-parallel pass (222 µs of DeltaNet's fwd+bwd on the H200,
# twentieth session) and a scratch tensor: it adds two dots to each step of the sequential scan,
# off its dependency chain. Opt-in until the H200 has timed it.
DU0_IN_SCAN = os.environ.get("LT2_DELTA_DU0_IN_SCAN", "0") == "1"


# The W-based reverse scan (`delta_dh_bwd_kernel`) with its state update on 16-bit operands (raw
# Wᵀ, Q and dO; dU' and a gated sQ as hi + lo halves) instead of TF32-rounded fp32 ones, and
# DeltaNet's without the gate code (GATE 0). On the H200 (twentieth session, B=4, T=8192, H=16,
# D=128, bf16) DeltaNet's fwd+bwd took 3.245 ms with it against 3.389, GDN's 3.852 against 3.839:
# "none" (the default) uses it for DeltaNet only, "1" for every rule, "0" for none.
def _bwd16_switch(value: str) -> str:
    if value not in ("none", "1", "0"):
        raise ValueError(f"LT2_DELTA_BWD16={value!r}: expected one of none, 1, 0")
    return value


BWD16 = _bwd16_switch(os.environ.get("LT2_DELTA_BWD16", "none"))


# The W-based backward's per-token scratch between its kernels (Pᵀ dO, dU' and Y = Tᵀ dU') in the
# input's 16-bit dtype instead of fp32 (16-bit inputs, DeltaNet and GDN), as the peer keeps them:
# half the bytes, and their readers take one dot of raw operands where an fp32 tile entered as
# hi + lo halves. The scan's state gradient dS stays fp32 in registers. "2" also stores the C x C
# kernel's s dP ⊙ Γ and β dA ⊙ Γ in 16 bits (as the peer does). Emulating the GPU's roundings (CPU
# interpreter, T = 1000, D = 64, bf16) GDN's dq stayed at 4.1e-3 relative RMS against float64
# with "1" (dv, dβ 2.4e-3 -> 3.6e-3) and rose to 6.4e-3 with "2". "0" (fp32) stays the default
# until the H200 has checked and timed the 16-bit forms (no device was lent in the session that
# built them; BENCHMARKS.md, twenty-first session).
def _bwd_lp_switch(value: str) -> int:
    if value not in ("0", "1", "2"):
        raise ValueError(f"LT2_DELTA_BWD_LP={value!r}: expected one of 0, 1, 2")
    return int(value)


BWD_LP = _bwd_lp_switch(os.environ.get("LT2_DELTA_BWD_LP", "0"))


def bwd_scratch_dtype(dtype: torch.dtype, gate: str, matrices: bool = False) -> torch.dtype:
    """The dtype of the W-based backward's scratch for inputs of `dtype`: the per-token tensors, or
    with `matrices` the C x C kernel's two (see BWD_LP)."""
    if int(matrices) < BWD_LP and gate != "channel" and dtype in (torch.bfloat16, torch.float16):
        return dtype
    return torch.float32


def use_w_backward(Aqk) -> bool:
    """Whether the backward runs the W-based scan: the default, and forced when no scores were kept."""
    return WBWD or Aqk is None or Aqk.numel() == 0


_WU_CONFIGS = [
    triton.Config({"BV": 64}, num_warps=4, num_stages=1),
    triton.Config({"BV": 128}, num_warps=8, num_stages=1),
]
_H_CONFIGS = [
    triton.Config({"BV": 64}, num_warps=4, num_stages=2),
    triton.Config({"BV": 32}, num_warps=4, num_stages=2),
    triton.Config({"BV": 64}, num_warps=8, num_stages=2),
    triton.Config({"BV": 32}, num_warps=4, num_stages=1),
]
# The fused scan holds S `[K, BV]`, Q, both key layouts and the chunk's scores: offline (sm_90,
# K = V = 128, bf16) every config is at 255 registers, with 64-440 B of spills per thread; BV 128
# at 8 warps (0.7-1 KB) and BV 64 at 4 warps unpipelined (up to 544 B) are not in the list.
_HO_CONFIGS = [
    triton.Config({"BV": 64}, num_warps=4, num_stages=2),
    triton.Config({"BV": 32}, num_warps=4, num_stages=2),
    triton.Config({"BV": 64}, num_warps=8, num_stages=2),
    triton.Config({"BV": 32}, num_warps=4, num_stages=1),
]
# The transposed scan's state is the left operand, so its value tile is the MMA's M: BV 64 is one
# warpgroup (4 warps), BV 128 two (8 warps); below 64 Triton falls back to the pre-Hopper MMA.
# Offline (sm_90, K = V = 128, bf16) all are at 255 registers with 88-368 B of spills per thread;
# BV 64 at 4 warps unpipelined (520-552 B) is not in the list.
_HOT_CONFIGS = [
    triton.Config({"BV": 64}, num_warps=4, num_stages=2),
    triton.Config({"BV": 64}, num_warps=8, num_stages=2),
    triton.Config({"BV": 128}, num_warps=8, num_stages=2),
    triton.Config({"BV": 32}, num_warps=4, num_stages=2),
]
_O_CONFIGS = [
    triton.Config({"BV": 64}, num_warps=4, num_stages=2),
    triton.Config({"BV": 128}, num_warps=8, num_stages=2),
    triton.Config({"BV": 64}, num_warps=8, num_stages=1),
]

# Kernels the GPU autotunes. The autotuner runs each several times on the same buffers, so none
# of them may read a buffer it writes (`test_delta_triton.test_autotuned_kernels_are_idempotent`).
AUTOTUNED_KERNELS: set = set()


def _tuned(kernel, configs, key, keep=None):
    """`autotuned_on_gpu`, recording the kernel in AUTOTUNED_KERNELS (on the CPU too)."""
    AUTOTUNED_KERNELS.add(kernel)
    return autotuned_on_gpu(kernel, configs, key, keep)


# UT transform with A from one dot and the substitution's rows loaded from a scratch copy
_WY_ROWS_CONFIGS = [
    triton.Config({}, num_warps=4, num_stages=1),
    triton.Config({}, num_warps=8, num_stages=1),
    # 2 warps, for 16-bit inputs (`_no_fp32_2warp`): the 16 x 16 substitution and block products
    # leave wider programs mostly idle, and 2-warp programs fit more per SM (255 registers, up to
    # 24 B of spills per thread offline at K = 128; with fp32 keys 2.4-12 KB). The H200's autotuner
    # picks it: 375 -> 271 µs per GDN forward at B=4, T=8192, H=16 (BENCHMARKS.md, tenth session).
    triton.Config({}, num_warps=2, num_stages=1),
]


def _no_fp32_2warp(config, args) -> bool:
    """2-warp configs only for 16-bit inputs: with fp32 (DOT_IEEE: FMA dots) they spill kilobytes."""
    return config.num_warps > 2 or args.get("DOT") != DOT_IEEE


_wy_rows = _tuned(delta_wy_rows_kernel, _WY_ROWS_CONFIGS, ["H", "HV", "K"], _no_fp32_2warp)
_qk_fwd = _tuned(delta_qk_fwd_kernel, _PREP_CONFIGS, ["H", "HV", "K"])
_state_bwd = _tuned(delta_state_bwd_kernel, _STATE_CONFIGS, ["H", "HV", "K", "V", "GATE"])
_grad_cc = _tuned(delta_grad_cc_kernel, _CC_CONFIGS, ["H", "HV", "K", "V", "GATE"])
_GRAD_KEY = ["H", "HV", "K", "V", "GATE"]
_grad_k_by_bk = {bk: _tuned(delta_grad_k_kernel, c, _GRAD_KEY) for bk, c in _GRAD_CONFIGS_BY_BK.items()}


def grad_bk(K: int, dtype: torch.dtype, gate: str) -> int:
    """The key tile of `delta_grad_k_kernel` for this head dim, input dtype and gate."""
    bk = GRAD_BK if dtype != torch.float32 and gate != "channel" else FP32_GRAD_BK
    if bk not in _GRAD_CONFIGS_BY_BK:
        raise ValueError(f"LT2_DELTA_GRAD_BK={bk}: expected one of {sorted(_GRAD_CONFIGS_BY_BK)}")
    return min(bk, pow2(K))


def _kda_narrow(config, args) -> bool:
    """KDA preparation configs below 4 warps only for 16-bit inputs: 2 warps for the split halves
    (PART 1, 2), 1 warp (a candidate) for the Aqk half alone (offline: 240 registers, no spills;
    the other half spills 744-808 B at 1 warp)."""
    if config.num_warps > 2:
        return True
    if args.get("DOT") == DOT_IEEE:
        return False
    return args.get("PART") == 1 if config.num_warps == 1 else args.get("PART") != 0


_kda_fwd = _tuned(kda_intra_fwd_kernel, _KDA_FWD_CONFIGS, ["H", "HV", "K", "PART"], _kda_narrow)
_DU0_CONFIGS = _O_CONFIGS
# LT2_DELTA_CANDIDATES=1 appends 2-warp configs that compile for sm_90 offline without spills (or
# with ≤ 112 B per thread) for 16-bit inputs but have not run on the H200: the UT transform gained
# 28% from 2 warps (tenth session), and these per-chunk kernels have the same 64-row tiles. The
# forced-config GPU tests and a timing decide whether they join the lists. With fp32 inputs
# (DOT_IEEE: fp32 FMA dots) 2 warps spill kilobytes: `_no_fp32_2warp` keeps them out of tuning.
CANDIDATES = os.environ.get("LT2_DELTA_CANDIDATES", "0") == "1"
if CANDIDATES:
    _O_CONFIGS.append(triton.Config({"BV": 64}, num_warps=2, num_stages=1))  # output, Pᵀ dO, Y
    # the transposed fused scan with the output's work moved off the recurrence (EARLY_P; offline
    # sm_90, bf16: 344-376 B of spills at 4 warps, 232-280 at 8)
    _HOT_CONFIGS.append(triton.Config({"BV": 64, "EARLY_P": 1}, num_warps=4, num_stages=2))
    _HOT_CONFIGS.append(triton.Config({"BV": 64, "EARLY_P": 1}, num_warps=8, num_stages=2))
    _WU_CONFIGS.append(triton.Config({"BV": 64}, num_warps=2, num_stages=2))
# The interpreter runs one fixed config: tests set this to check the EARLY_P order on the CPU.
HOT_EARLY_P = 0

# The W-based reverse scan (`delta_dh_bwd_kernel`) fits the forward scan's tiles (not its candidates).
_DHW_CONFIGS = _H_CONFIGS[:4]
if CANDIDATES:
    # three-stage prefetch of the next chunk's Q, K, Wᵀ, dO and Pᵀ dO (the peer's reverse scan
    # autotunes over 2-4 stages): offline sm_90, K = V = 128, bf16, 156-209 KB of shared memory,
    # no spills in DeltaNet's 16-bit scan or GDN's (0-96 B with Y or Pᵀ dO formed there, 312 B in
    # KDA's at 4 warps). BV 64 at 8 warps, 3 stages needs 232-247 KB with Y formed there or for
    # KDA, past the 227 KB a block may have; at 4 warps it spills 112-184 B.
    _DHW_CONFIGS = [
        *_DHW_CONFIGS,
        triton.Config({"BV": 32}, num_warps=4, num_stages=3),
        triton.Config({"BV": 32}, num_warps=8, num_stages=3),
    ]
_wu_fwd = _tuned(delta_wu_fwd_kernel, _WU_CONFIGS, ["H", "HV", "K", "V", "GATE"], _no_fp32_2warp)
_h_fwd = _tuned(delta_h_fwd_kernel, _H_CONFIGS, ["H", "HV", "K", "V", "GATE"])
_ho_fwd = _tuned(delta_ho_fwd_kernel, _HO_CONFIGS, ["H", "HV", "K", "V", "GATE", "SAVE"])
_hot_fwd = _tuned(delta_hot_fwd_kernel, _HOT_CONFIGS, ["H", "HV", "K", "V", "GATE", "SAVE"])
_o_fwd = _tuned(delta_o_fwd_kernel, _O_CONFIGS, ["H", "HV", "K", "V", "GATE"], _no_fp32_2warp)
_dhw_bwd = _tuned(
    delta_dh_bwd_kernel, _DHW_CONFIGS, ["H", "HV", "K", "V", "GATE", "D16", "FORM_Y", "FORM_DU0"]
)
_dht_bwd = _tuned(delta_dht_bwd_kernel, _HOT_CONFIGS[:4], ["H", "HV", "K", "V", "GATE"])
_y_bwd = _tuned(delta_y_kernel, _DU0_CONFIGS, ["HV", "V", "STORE_DV"], _no_fp32_2warp)
_du0 = _tuned(delta_du0_kernel, _DU0_CONFIGS, ["H", "HV", "K", "V", "GATE"], _no_fp32_2warp)
TUNED = [
    t
    for t in (
        _qk_fwd,
        _state_bwd,
        _grad_cc,
        *_grad_k_by_bk.values(),
        _kda_fwd,
        _h_fwd,
        _ho_fwd,
        _hot_fwd,
        _o_fwd,
        _wy_rows,
        _du0,
        _wu_fwd,
        _dhw_bwd,
        _dht_bwd,
        _y_bwd,
    )
    if t is not None
]
N_CONFIGS = max(
    len(_STATE_CONFIGS),
    len(_CC_CONFIGS),
    *map(len, _GRAD_CONFIGS_BY_BK.values()),
    len(_PREP_CONFIGS),
    len(_KDA_FWD_CONFIGS),
    len(_H_CONFIGS),
    len(_HO_CONFIGS),
    len(_HOT_CONFIGS),
    len(_O_CONFIGS),
    len(_DHW_CONFIGS),
)


def forced_config(i: int):
    """Every autotuned delta-rule kernel runs config i of its list (see `forced_autotune_config`)."""
    return forced_autotune_config(TUNED, i)


def launch(tuned, plain, grid, *args, fixed: dict | None = None, **kwargs):
    """Run `tuned` (GPU, autotuned) or `plain` with the `fixed` meta-parameters and launch options."""
    if tuned is not None:
        return tuned[grid](*args, **kwargs)
    meta = dict(kwargs, **(fixed or {}))
    g = grid(meta) if callable(grid) else grid
    return plain[g](*args, **meta)


def dot_mode(dtype: torch.dtype) -> int:
    if triton_interpreting():
        return DOT_INTERP
    return DOT_IEEE if dtype == torch.float32 else DOT_NATIVE


def split_mode(dtype: torch.dtype) -> bool:
    """Whether dots on computed fp32 tiles take them as hi + lo 16-bit pairs (see `compute_dtype`)."""
    return dtype != torch.float32 and not BF16_DOTS


def compute_dtype(dtype: torch.dtype):
    """Operand dtype of the dots on computed quantities (states, U', T, dS, Y, ...).

    fp32 by default: with 16-bit inputs these dots then run as TF32 on the tensor cores, whose
    rounding is 8x finer than bf16's. With bf16 operands the chunked forms lose ~1% relative RMS
    against float64 (cancellation between the inter- and intra-chunk terms), the whole bf16
    budget; LT2_DELTA_BF16_DOTS=1 selects them anyway (faster, for comparison). Products of two raw
    inputs (Q Kᵀ, K Kᵀ) always use the input dtype: they are exact either way.
    """
    if dtype == torch.float32 or not BF16_DOTS:
        return tl.float32
    return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16


def pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


class ChunkMeta:
    """Chunk bookkeeping of one call: sizes, and for varlen the chunk tables (one host sync)."""

    def __init__(self, B: int, T: int, HV: int, cu_seqlens: torch.Tensor | None):
        self.B, self.T, self.HV = B, T, HV
        self.varlen = cu_seqlens is not None
        self.cu = cu_seqlens
        if cu_seqlens is None:
            self.N = B
            self.NT = triton.cdiv(T, BT)
            self.n_chunks = B * self.NT
            self.chunk_indices = self.chunk_offsets = None
            return
        cu = cu_seqlens.tolist()
        if cu[0] != 0 or cu[-1] != T or any(a > b for a, b in pairwise(cu)):
            raise ValueError(f"`cu_seqlens` must rise from 0 to T={T}, got {cu}")
        counts = [triton.cdiv(b - a, BT) for a, b in pairwise(cu)]
        pairs = [(n, i) for n, c in enumerate(counts) for i in range(c)]
        dev = cu_seqlens.device
        self.N = len(counts)
        self.NT = 1
        self.n_chunks = len(pairs)
        self.chunk_indices = torch.tensor(pairs or [(0, 0)], dtype=torch.int32, device=dev)
        offsets = [0]
        for c in counts[:-1]:
            offsets.append(offsets[-1] + c)
        self.chunk_offsets = torch.tensor(offsets, dtype=torch.int32, device=dev)

    @staticmethod
    def max_chunks(B: int, T: int, N: int, varlen: bool) -> int:
        """Rows of chunk-indexed buffers, known from shapes alone (fake tensors need that)."""
        return triton.cdiv(T, BT) + N if varlen else B * triton.cdiv(T, BT)

    def chunk_grid(self, bh: int):
        """Grid of per-chunk kernels: (chunks of one batch row, B*HV) or (all chunks, HV)."""
        return (self.n_chunks, self.HV) if self.varlen else (self.NT, bh)


def wy_fwd(q, k, g, beta, gate: str, scale: float, meta: ChunkMeta, scores: bool = True):
    """DeltaNet / GDN chunk preparation (KDA has its own): the gate cumsum `[B*T, HV]` (zeros for
    DeltaNet, whose state scans run the scalar-gate code), T = (I + A)^{-1} and the output scores
    Aqk, both `[B*T, HV, 64]` fp32. Without `scores` Aqk is None (the forward forms P itself; only
    the fused reverse scan reads Aqk)."""
    B, T, H, K = k.shape
    HV = beta.shape[-1]
    Ainv = empty(k, B * T, HV, BT, dtype=torch.float32)
    Aqk = empty(k, B * T, HV, BT, dtype=torch.float32) if scores else None
    if gate == "scalar":
        gcum = empty(k, B * T, HV, dtype=torch.float32)
    else:
        gcum = torch.zeros(B * T, HV, dtype=torch.float32, device=k.device)
    common = dict(H=H, HV=HV, K=K, BT=BT, BK=pow2(K), USE_G=gate == "scalar", IS_VARLEN=meta.varlen,
                  DOT=dot_mode(k.dtype))  # fmt: skip
    grid = meta.chunk_grid(B * HV)
    launch(
        _wy_rows,
        delta_wy_rows_kernel,
        grid,
        k,
        g if g is not None else beta,
        beta,
        gcum,
        Ainv,
        meta.cu,
        meta.chunk_indices,
        T,
        **common,
    )
    if not scores:
        return gcum, Ainv, None
    launch(
        _qk_fwd, delta_qk_fwd_kernel, grid, q, k, gcum, Aqk, meta.cu, meta.chunk_indices, T, scale, **common
    )
    return gcum, Ainv, Aqk


def state_bk(K: int) -> int:
    """Key tile of the state scans: at least 32. On the H200 (Triton 3.6) the reverse scan hit an
    illegal memory access with K = 16 (a 16-row tile, all three gate kinds) while K = 24 and 32 ran
    right; rows past K are masked loads of zeros, so a wider tile does not change the math."""
    return max(32, pow2(K))


def _state_gate(gate: str) -> int:
    """The state scans' GATE: DeltaNet takes the scalar-gate code with b = 0 (one code shape),
    except in the transposed fused scan, which `state_fwd` compiles without the gate (NOGATE)."""
    return GATE_IDS["scalar"] if gate == "none" else GATE_IDS[gate]


def state_fwd(q, k, v, gcum, beta, Ainv, Aqk, h0, scale, gate, meta: ChunkMeta, want_final, save):
    """Output `[B, T, HV, V]`, final state, and (if `save`) per-chunk states and U' for the backward,
    by the kernels of `delta_split`; Aqk is read only for the per-channel gate.

    With WU, W and U are formed per chunk first and the scan does two dots per chunk; without (the
    default), the scan applies T itself (three dots, U' kept in fp32 for the output).
    """
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    dt = k.dtype
    wu = WU
    fused = (not save if FUSED_O is None else FUSED_O) and _state_gate(gate) == GATE_IDS["scalar"]
    if fused and not (gate == "none" and NOGATE and TSTATE):
        fused = gated_scan_fills(meta.N * HV * triton.cdiv(V, 64), sm_count(k.device))
    o = empty(v, *v.shape)
    # the fused scan keeps S_c and U' in registers: stored only for the backward
    vnew = empty(v, *v.shape) if save or not fused else o
    un = vnew if wu or fused else empty(v, *v.shape, dtype=torch.float32)
    h = empty(k, ChunkMeta.max_chunks(B, T, meta.N, meta.varlen), HV, K, V) if save or not fused else o
    ht = empty(v, meta.N, HV, K, V, dtype=torch.float32) if want_final else o
    common = dict(H=H, HV=HV, K=K, V=V, BT=BT, BK=state_bk(K), GATE=_state_gate(gate), IS_VARLEN=meta.varlen,
                  DOT=dot_mode(dt), PREC=split_mode(dt), fixed={"BV": min(32, pow2(V))})  # fmt: skip
    cgrid = meta.chunk_grid(B * HV)
    w = u = o
    if wu:
        w, u = empty(k, B * T, HV, K), empty(v, *v.shape)
        launch(_wu_fwd, delta_wu_fwd_kernel, cgrid, k, v, gcum, beta, Ainv, w, u, meta.cu, meta.chunk_indices,
               T, **common)  # fmt: skip

    def hgrid(m):
        return (triton.cdiv(V, m["BV"]), meta.N * HV)

    if fused:
        tuned, plain = (_hot_fwd, delta_hot_fwd_kernel) if TSTATE else (_ho_fwd, delta_ho_fwd_kernel)
        if TSTATE:  # the interpreter's fixed config (the GPU's come from the autotune list)
            common["fixed"] = dict(common["fixed"], EARLY_P=HOT_EARLY_P)
            # DeltaNet's scan skips the gate's loads and exponentials (GATE 0) instead of b = 0
            if NOGATE:
                common["GATE"] = GATE_IDS[gate]
        launch(tuned, plain, hgrid, q, k, v, gcum, beta, Ainv, w, u,
               h0 if h0 is not None else o, h, vnew, o, ht, meta.cu, meta.chunk_offsets, T, scale,
               USE_H0=h0 is not None, STORE_FINAL=want_final, SAVE=save, WU=wu, **common)  # fmt: skip
        return o, (ht if want_final else None), (h if save else None), (vnew if save else None)

    launch(_h_fwd, delta_h_fwd_kernel, hgrid, k, v, gcum, beta, Ainv, w, u, h0 if h0 is not None else o, h,
           un, vnew, ht, meta.cu, meta.chunk_offsets, T, USE_H0=h0 is not None, STORE_FINAL=want_final,
           STORE_VNEW=save and not wu, WU=wu, **common)  # fmt: skip

    def ogrid(m):
        return (triton.cdiv(V, m["BV"]), *cgrid)

    launch(_o_fwd, delta_o_fwd_kernel, ogrid, q, k, gcum, Aqk if Aqk is not None else o, h, un, o,
           meta.cu, meta.chunk_indices, T, scale, **common)  # fmt: skip
    return o, (ht if want_final else None), (h if save else None), (vnew if save else None)


def y_in_cc(Aqk) -> bool:
    """Whether the C x C gradient kernel forms Y (Y_IN_CC, W-based backward only): `state_bwd`
    then returns dU' in Y's place and `grad_chunks` takes T to form Y."""
    return Y_IN_CC and use_w_backward(Aqk)


def state_bwd(q, k, gcum, beta, Ainv, Aqk, do, dht, scale, gate, meta: ChunkMeta, want_dh0, dv_dtype=None):
    """Reverse scan: per-chunk state gradients dh, Y = Tᵀ dU' (dU' itself when `y_in_cc`), the
    initial-state gradient, and dv = β ⊙ Y `[B*T, HV, V]` in `dv_dtype` (default do's) where the
    pass forming Y wrote it (`delta_y_kernel` with a 16-bit Y, from Y before rounding), else None
    (the C x C kernel writes it)."""
    B, T, H, K = k.shape
    HV, V = do.shape[2], do.shape[3]
    n_rows = ChunkMeta.max_chunks(B, T, meta.N, meta.varlen)
    dh = empty(k, n_rows, HV, K, V)
    dh0 = empty(do, meta.N, HV, K, V, dtype=torch.float32) if want_dh0 else dh
    gid = _state_gate(gate)
    if not use_w_backward(Aqk):
        Y = empty(k, *do.shape, dtype=torch.float32)
        _fused_state_bwd(q, k, gcum, beta, Ainv, Aqk, do, dht, dh, Y, dh0, scale, gid, meta, want_dh0)
        return dh, Y, (dh0 if want_dh0 else None), None
    # The W-based backward: Pᵀ dO for all chunks in parallel, the two-dot reverse scan, Y after.
    dt = k.dtype
    common = dict(H=H, HV=HV, K=K, V=V, BT=BT, BK=state_bk(K), GATE=gid, IS_VARLEN=meta.varlen,
                  DOT=dot_mode(dt), PREC=split_mode(dt))  # fmt: skip
    cgrid = meta.chunk_grid(B * HV)

    def ugrid(m):
        return (triton.cdiv(V, m["BV"]), *cgrid)

    def grid(m):
        return (triton.cdiv(V, m["BV"]), meta.N * HV)

    sdt = bwd_scratch_dtype(dt, gate)
    du0 = empty(do, *do.shape, dtype=sdt)  # Pᵀ dO, then Y (the Y pass writes it)
    # the transposed scan (TSTATE_BWD) and KDA's per-channel scores read Pᵀ dO from the pass
    du0_in_scan = (
        DU0_IN_SCAN and gid != GATE_IDS["channel"] and not (TSTATE_BWD and gid == GATE_IDS["scalar"])
    )
    if not du0_in_scan:
        scores = Aqk if Aqk is not None and Aqk.numel() else do
        launch(_du0, delta_du0_kernel, ugrid, q, k, gcum, scores, do, du0, meta.cu, meta.chunk_indices, T,
               scale, fixed={"BV": min(32, pow2(V))}, **common)  # fmt: skip
    dht_ = dht if dht is not None else do
    # W recomputed (one chunk-parallel pass) rather than kept from the forward
    w = empty(k, B * T, HV, K)
    launch(_wu_fwd, delta_wu_fwd_kernel, cgrid, k, do, gcum, beta, Ainv, w, do, meta.cu, meta.chunk_indices,
           T, STORE_U=False, fixed={"BV": min(32, pow2(V))}, **common)  # fmt: skip
    # dU' goes to `du`, then Y = Tᵀ dU' into du0's buffer (read by the scan before): no autotuned
    # kernel reads a buffer it writes (each runs several times while autotuning).
    du = empty(do, *do.shape, dtype=sdt)
    tuned, plain = (_dhw_bwd, delta_dh_bwd_kernel)
    if TSTATE_BWD and gid == GATE_IDS["scalar"]:
        tuned, plain = (_dht_bwd, delta_dht_bwd_kernel)
    elif BWD16 == "1" or (BWD16 == "none" and gate == "none"):
        common["D16"] = split_mode(dt)
        if gate == "none":
            common["GATE"] = GATE_IDS["none"]
    # not in GDN's 16-bit scan (BWD16=1, opt-in): with Y there it spills up to 528 B offline
    gated16 = common.get("D16") and common["GATE"] == GATE_IDS["scalar"]
    form_y = Y_IN_SCAN and plain is delta_dh_bwd_kernel and not y_in_cc(Aqk) and not gated16
    if form_y:
        common["FORM_Y"] = True
    if du0_in_scan:
        common["FORM_DU0"] = True
    args = (q, k, w, gcum, do, du0, dht_, dh, du, dh0)
    if plain is delta_dh_bwd_kernel:
        args = (*args, Ainv)
    launch(tuned, plain, grid, *args, meta.cu, meta.chunk_offsets, T, scale, USE_DHT=dht is not None,
           STORE_DH0=want_dh0, fixed={"BV": min(32, pow2(V))}, **common)  # fmt: skip
    if y_in_cc(Aqk) or form_y:  # `du` holds dU' (C x C forms Y) or Y itself
        return dh, du, (dh0 if want_dh0 else None), None
    tdt = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dt]
    Y = du0
    # with fp32 scratch the C x C kernel writes dv from Y as before (no rounding in between)
    store_dv = sdt != torch.float32
    dv = empty(do, *do.shape, dtype=dv_dtype or do.dtype) if store_dv else None
    dv_ = dv if store_dv else Y
    launch(_y_bwd, delta_y_kernel, ugrid, Ainv, du, Y, beta, dv_, meta.cu, meta.chunk_indices,
           T, HV=HV, V=V, BT=BT, IS_VARLEN=meta.varlen, DOT=dot_mode(dt), PREC=split_mode(dt), DT=tdt,
           STORE_DV=store_dv, fixed={"BV": min(32, pow2(V))})  # fmt: skip
    return dh, Y, (dh0 if want_dh0 else None), dv


def _fused_state_bwd(q, k, gcum, beta, Ainv, Aqk, do, dht, dh, Y, dh0, scale, gid, meta, want_dh0):
    B, T, H, K = k.shape
    HV, V = do.shape[2], do.shape[3]

    def grid(m):
        return (triton.cdiv(V, m["BV"]), meta.N * HV)

    launch(_state_bwd, delta_state_bwd_kernel, grid, q, k, gcum, beta, Ainv, Aqk, do,
           dht if dht is not None else do, dh, Y, dh0, meta.cu, meta.chunk_offsets, T, scale, H=H, HV=HV,
           K=K, V=V, BT=BT, BK=state_bk(K), GATE=gid, USE_DHT=dht is not None, STORE_DH0=want_dh0,
           IS_VARLEN=meta.varlen, DOT=dot_mode(k.dtype), PREC=split_mode(k.dtype),
           fixed={"BV": min(16, pow2(V))})  # fmt: skip


def kda_split() -> bool:
    """KDA's preparation as two launches, Aqk and then gcum with T (the default), or as the one
    kernel forming both (`LT2_KDA_SPLIT=0`). Read at each call, so one process can time both.

    The single kernel holds twenty 16 x 16 fp32 accumulators (replicated across warps in the dots'
    layout) and spills 128-280 B per thread offline at every config, one program per SM at 8
    warps; each half holds ten, fits at 2 warps, and the autotuner picks 2 warps for both. On the
    H200 (B=4, T=8192, H=16, D=128, bf16; BENCHMARKS.md, thirteenth session) the preparation went
    from 2017 to 1573 µs and the KDA forward from 3.179 to 2.746 ms.
    """
    return os.environ.get("LT2_KDA_SPLIT", "1") != "0"


def kda_prep_fwd(q, k, g, beta, scale, meta: ChunkMeta):
    """KDA: per-channel gcum `[B*T, HV, K]`, T and the gated scores Aqk `[B*T, HV, 64]` (fp32)."""
    B, T, H, K = k.shape
    HV = beta.shape[-1]
    Ainv = empty(k, B * T, HV, BT, dtype=torch.float32)
    Aqk = empty(k, B * T, HV, BT, dtype=torch.float32)
    gcum = empty(k, B * T, HV, K, dtype=torch.float32)
    for part in (1, 2) if kda_split() else (0,):
        launch(
            _kda_fwd,
            kda_intra_fwd_kernel,
            meta.chunk_grid(B * HV),
            q,
            k,
            g,
            beta,
            gcum,
            Ainv,
            Aqk,
            meta.cu,
            meta.chunk_indices,
            T,
            scale,
            H=H,
            HV=HV,
            K=K,
            BT=BT,
            IS_VARLEN=meta.varlen,
            DOT=dot_mode(k.dtype),
            CT=compute_dtype(k.dtype),
            SPAN=kda_diag_span(k.dtype),
            PART=part,
            fixed={
                "BK": min(KDA_FWD_BK, pow2(K)),
                "num_warps": KDA_FWD_WARPS,
                "num_stages": 1,
            },
        )
    return gcum, Ainv, Aqk


def grad_chunks(q, k, v, gcum, beta, h, dh, vnew, Y, do, scale, gate, meta: ChunkMeta, Ainv=None, dv=None):
    """dq, dk `[B*T, HV, K]` per value head, dv, dβ `[B*T, HV]` and dg (fp32) of a chunk pass
    (dv as given when the pass that formed Y wrote it).

    dq, dk come in the input dtype when nothing is added to them afterwards (no grouped value
    heads to sum, no KDA intra-chunk pass), else in fp32. With `Ainv` (T), `Y` holds dU' and the
    C x C kernel forms Y = Tᵀ dU' into a buffer of its own (`y_in_cc`).
    """
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    dt, f32 = k.dtype, torch.float32
    gid = GATE_IDS[gate]
    grid = meta.chunk_grid(B * HV)
    common = dict(H=H, HV=HV, K=K, BT=BT, IS_VARLEN=meta.varlen)
    store_dv = dv is None
    dv = empty(v, *v.shape) if store_dv else dv
    mdt = bwd_scratch_dtype(dt, gate, matrices=True)
    MA, MB = empty(q, B * T, HV, BT, dtype=mdt), empty(q, B * T, HV, BT, dtype=mdt)
    dbeta_p = empty(q, B * T, HV, dtype=f32)
    db_p = empty(q, B * T, HV, dtype=f32) if gate == "scalar" else dbeta_p
    du = Y
    if Ainv is not None:
        Y = empty(v, *v.shape, dtype=bwd_scratch_dtype(dt, gate))
    launch(
        _grad_cc,
        delta_grad_cc_kernel,
        grid,
        q,
        k,
        v,
        gcum,
        beta,
        vnew,
        Ainv if Ainv is not None else du,
        du,
        Y,
        do,
        dv,
        MA,
        MB,
        dbeta_p,
        db_p,
        meta.cu,
        meta.chunk_indices,
        T,
        scale,
        V=V,
        BK=pow2(K),
        GATE=gid,
        DOT=dot_mode(dt),
        PREC=split_mode(dt),
        FORM_Y=Ainv is not None,
        STORE_DV=store_dv,
        fixed={"BV": min(64, pow2(V))},
        **common,
    )
    BKs = grad_bk(K, dt, gate)
    NK = triton.cdiv(K, BKs)
    NC = ChunkMeta.max_chunks(B, T, meta.N, meta.varlen)
    dqk_dtype = dt if (gate != "channel" and HV == H) else f32
    dq, dk = empty(q, B * T, HV, K, dtype=dqk_dtype), empty(q, B * T, HV, K, dtype=dqk_dtype)
    dg = {
        "channel": lambda: empty(q, B * T, HV, K, dtype=f32),
        "scalar": lambda: empty(q, B * T, HV, dtype=f32),
        "none": lambda: dbeta_p,
    }[gate]()
    part = empty(q, NK, B * T, HV, 3, dtype=f32)
    part_sds = empty(q, NK, NC, HV, dtype=f32)
    launch(
        # a head dim below 32 narrows the tile under every list's key; the 32-wide list fits it
        _grad_k_by_bk.get(BKs, _grad_k_by_bk[32]),
        delta_grad_k_kernel,
        (NK, *grid),
        q,
        k,
        gcum,
        beta,
        h,
        dh,
        vnew,
        Y,
        do,
        MA,
        MB,
        dq,
        dk,
        dg if gate == "channel" else dq,
        part,
        part_sds,
        meta.cu,
        meta.chunk_indices,
        T,
        B * T,
        NC,
        scale,
        V=V,
        BK=BKs,
        GATE=gid,
        DOT=dot_mode(dt),
        PREC=split_mode(dt),
        fixed={"BV": min(32, pow2(V))},
        **common,
    )
    if gate == "channel":
        dbeta_intra = _kda_intra_bwd(q, k, gcum, beta, MA, MB, dq, dk, dg, scale, meta)
        return dq, dk, dv, dbeta_p + part[..., 0].sum(0) + dbeta_intra, dg
    dbeta = empty(q, B * T, HV, dtype=f32)
    delta_grad_final_kernel[grid](
        gcum,
        beta,
        dbeta_p,
        db_p,
        part,
        part_sds,
        dbeta,
        dg if gate == "scalar" else dbeta,
        meta.cu,
        meta.chunk_indices,
        T,
        B * T,
        NC,
        scale,
        HV=HV,
        K=K,
        BT=BT,
        NK=NK,
        GATE=gid,
        IS_VARLEN=meta.varlen,
    )
    return dq, dk, dv, dbeta, (dg if gate == "scalar" else None)


def _kda_intra_bwd(q, k, gcum, beta, MA, MB, dq, dk, dg, scale, meta: ChunkMeta):
    """KDA's gated intra-chunk gradient terms, added into dq, dk, dg; returns the dβ part."""
    from lt2dsl.kernels.delta.kda_grad import kda_grad_intra_kernel

    B, T, H, K = k.shape
    HV = beta.shape[-1]
    bk, warps = kda_grad_tiles()
    BKs = min(bk, pow2(K))
    NK = triton.cdiv(K, BKs)
    dbeta_intra = empty(q, NK, B * T, HV, dtype=torch.float32)
    for half in (1, 2) if kda_grad_split() else (0,):
        launch(
            None,
            kda_grad_intra_kernel,
            (NK, *meta.chunk_grid(B * HV)),
            q,
            k,
            gcum,
            beta,
            MA,
            MB,
            dq,
            dk,
            dg,
            dbeta_intra,
            meta.cu,
            meta.chunk_indices,
            T,
            B * T,
            scale,
            H=H,
            HV=HV,
            K=K,
            BT=BT,
            BK=BKs,
            IS_VARLEN=meta.varlen,
            DOT=dot_mode(k.dtype),
            CT=compute_dtype(k.dtype),
            SPAN=kda_diag_span(k.dtype),
            HALF=half,
            fixed={"num_warps": warps, "num_stages": 1},
        )
    return dbeta_intra.sum(0)


def kda_grad_split() -> bool:
    """KDA's intra-chunk gradients as two launches, the row terms (dq, Z) and then the column terms
    (dk) with dg's cumulative sum (`LT2_KDA_GRAD_SPLIT=1`), rather than one kernel. Offline sm_90
    at BK 32, 4 warps: 186 and 182 registers without spills, against 255 and 104 B of spills for
    the single kernel; each half recomputes the exponentials of its blocks. Off: on the H200 it
    passed the KDA GPU tests it reached (11, none failed) but made KDA's fwd+bwd slower, 11.180
    against 9.370 ms at B=4, T=8192, H=16, D=128 bf16 (fourteenth session, call 2): the halves'
    recomputed exponentials and twice-read tiles cost more than the spills they remove. Kept as
    an option, tested on the CPU, for other head dims. Read at each call."""
    return os.environ.get("LT2_KDA_GRAD_SPLIT", "0") == "1"


def kda_grad_tiles() -> tuple[int, int]:
    """(BK, warps) of KDA's intra-chunk gradient kernel: KDA_BK, KDA_WARPS unless `LT2_KDA_GRAD=BK,warps`
    (read at each call, for timing others in one process; the kernel read-modify-writes dq, dk and
    dg, so it is not autotuned)."""
    env = os.environ.get("LT2_KDA_GRAD")
    if not env:
        return KDA_BK, KDA_WARPS
    bk, warps = (int(x) for x in env.split(","))
    return bk, warps
