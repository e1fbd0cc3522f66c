"""Host side of the delta-rule kernels: buffers, grids and launches of one call's forward.

Forward (chunks of BT = 64 tokens): the preparation (`wy.delta_wy_rows_kernel`, or KDA's
`kda_prep.kda_intra_fwd_kernel` in two launches) forms T = (I + A)^{-1} per chunk; then either the
fused scan forms the output itself (`scan.delta_hot_fwd_kernel`) or the split form scans
(`delta_h_fwd_kernel`) and writes the output per chunk (`delta_o_fwd_kernel`), as the call's
`DeltaRecipe` says. The backward's launches are in `launch_bwd`, the autotune lists in `configs`.
Decode runs `recurrent.delta_recurrent_kernel` (`ops`).
"""

from __future__ import annotations

from itertools import pairwise

import torch
import triton

from lt2dsl.kernels.common.backend import new_empty, triton_interpreting
from lt2dsl.kernels.delta import configs
from lt2dsl.kernels.delta.helpers import DOT_IEEE, DOT_INTERP, DOT_NATIVE
from lt2dsl.kernels.delta.kda_prep import kda_intra_fwd_kernel
from lt2dsl.kernels.delta.recipe import DeltaRecipe
from lt2dsl.kernels.delta.scan import delta_h_fwd_kernel, delta_hot_fwd_kernel, delta_o_fwd_kernel
from lt2dsl.kernels.delta.wy import delta_wy_rows_kernel

BT = 64
GATE_IDS = {"none": 0, "scalar": 1, "channel": 2}
# KDA's preparation at the interpreter's fixed config (the GPU autotunes `configs.KDA_PREP`)
KDA_FWD_BK, KDA_FWD_WARPS = 32, 8


def empty(like: torch.Tensor, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`common.backend.new_empty`: torch.empty on `like`'s device, NaN-filled under LT2_POISON=1."""
    return new_empty(like, *shape, dtype=dtype)


def launch(tuned, plain, grid, *args, fixed: dict | None = None, **kwargs):
    """Run `tuned` (GPU, autotuned) or `plain` with the `fixed` meta-parameters and launch options."""
    if tuned is not None:
        return tuned[grid](*args, **kwargs)
    meta = dict(kwargs, **(fixed or {}))
    g = grid(meta) if callable(grid) else grid
    return plain[g](*args, **meta)


def dot_mode(dtype: torch.dtype) -> int:
    """How `tl.dot` runs (`helpers.mm`): tf32x3 for fp32 inputs, native for 16-bit ones."""
    if triton_interpreting():
        return DOT_INTERP
    return DOT_IEEE if dtype == torch.float32 else DOT_NATIVE


def split_mode(dtype: torch.dtype) -> bool:
    """PREC: whether dots on computed fp32 tiles keep fp32-grade operands (TF32, or hi + lo 16-bit
    halves) rather than the input's 16 bits. With 16-bit operands everywhere the chunked forms land
    at ~1% relative RMS against float64 (the inter- and intra-chunk terms partly cancel), the whole
    bf16 budget; fp32 inputs take tf32x3 dots and need no split."""
    return dtype != torch.float32


def pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


def state_bk(K: int) -> int:
    """Key tile of the state scans: at least 32. On the H200 (Triton 3.6) the reverse scan hit an
    illegal memory access with 16-row key tiles; rows past K are masked loads of zeros, so a wider
    tile does not change the math."""
    return max(32, pow2(K))


def state_gate(gate: str) -> int:
    """GATE of the split form's kernels: DeltaNet runs the scalar-gate code with b = 0 (its gcum is
    zeros); only the fused scan and the reverse scan have a gate-free form (GATE 0)."""
    return GATE_IDS["scalar"] if gate == "none" else GATE_IDS[gate]


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


def wy_fwd(k, g, beta, gate: str, meta: ChunkMeta):
    """DeltaNet / GDN chunk preparation (KDA has its own): the gate cumsum `[B*T, HV]` (zeros for
    DeltaNet, whose split-form kernels run the scalar-gate code) and T = (I + A)^{-1}
    `[B*T, HV, 64]` fp32."""
    B, T, H, K = k.shape
    HV = beta.shape[-1]
    Ainv = empty(k, B * T, HV, BT, dtype=torch.float32)
    if gate == "scalar":
        gcum = empty(k, B * T, HV, dtype=torch.float32)
    else:
        gcum = torch.zeros(B * T, HV, dtype=torch.float32, device=k.device)
    launch(configs.wy_rows, delta_wy_rows_kernel, meta.chunk_grid(B * HV), k, g if g is not None else beta,
           beta, gcum, Ainv, meta.cu, meta.chunk_indices, T, H=H, HV=HV, K=K, BT=BT, BK=pow2(K),
           USE_G=gate == "scalar", IS_VARLEN=meta.varlen, DOT=dot_mode(k.dtype))  # fmt: skip
    return gcum, Ainv


def kda_prep_fwd(q, k, g, beta, scale, meta: ChunkMeta, recipe: DeltaRecipe):
    """KDA: per-channel gcum `[B*T, HV, K]`, T and the gated scores Aqk `[B*T, HV, 64]` (fp32), by
    two launches (PART 1: Aqk; PART 2: gcum and T)."""
    B, T, H, K = k.shape
    HV = beta.shape[-1]
    Ainv = empty(k, B * T, HV, BT, dtype=torch.float32)
    Aqk = empty(k, B * T, HV, BT, dtype=torch.float32)
    gcum = empty(k, B * T, HV, K, dtype=torch.float32)
    fixed = {"BK": min(KDA_FWD_BK, pow2(K)), "num_warps": KDA_FWD_WARPS, "num_stages": 1}
    for part in (1, 2):
        launch(configs.kda_prep, kda_intra_fwd_kernel, meta.chunk_grid(B * HV), q, k, g, beta, gcum, Ainv,
               Aqk, meta.cu, meta.chunk_indices, T, scale, H=H, HV=HV, K=K, BT=BT, IS_VARLEN=meta.varlen,
               DOT=dot_mode(k.dtype), SPAN=recipe.kda_diag_span, PART=part, fixed=fixed)  # fmt: skip
    return gcum, Ainv, Aqk


def state_fwd(q, k, v, gcum, beta, Ainv, Aqk, h0, scale, gate, meta: ChunkMeta, want_final, save, recipe):
    """Output `[B, T, HV, V]`, final state, and (if `save`) per-chunk states and U' for the backward,
    by the fused scan or the split form (`recipe.fused_scan`); Aqk is read only for KDA's gate."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    dt = k.dtype
    fused = recipe.fused_scan
    o = empty(v, *v.shape)
    # the fused scan keeps S_c and U' in registers: stored only for the backward
    vnew = empty(v, *v.shape) if save or not fused else o
    un = vnew if fused else empty(v, *v.shape, dtype=torch.float32)
    h = empty(k, ChunkMeta.max_chunks(B, T, meta.N, meta.varlen), HV, K, V) if save or not fused else o
    ht = empty(v, meta.N, HV, K, V, dtype=torch.float32) if want_final else o
    h0_ = h0 if h0 is not None else o
    ends = dict(USE_H0=h0 is not None, STORE_FINAL=want_final)
    common = dict(H=H, HV=HV, K=K, V=V, BT=BT, BK=state_bk(K), IS_VARLEN=meta.varlen, DOT=dot_mode(dt),
                  PREC=split_mode(dt), fixed={"BV": min(32, pow2(V))})  # fmt: skip

    def hgrid(m):
        return (triton.cdiv(V, m["BV"]), meta.N * HV)

    if fused:
        launch(configs.hot_fwd, delta_hot_fwd_kernel, hgrid, q, k, v, gcum, beta, Ainv, h0_, h, vnew, o, ht,
               meta.cu, meta.chunk_offsets, T, scale, GATE=GATE_IDS[gate], SAVE=save, **ends,
               **common)  # fmt: skip
        return o, (ht if want_final else None), (h if save else None), (vnew if save else None)
    gid = state_gate(gate)
    launch(configs.h_fwd, delta_h_fwd_kernel, hgrid, k, v, gcum, beta, Ainv, h0_, h, un, vnew, ht, meta.cu,
           meta.chunk_offsets, T, GATE=gid, STORE_VNEW=save, **ends, **common)  # fmt: skip
    cgrid = meta.chunk_grid(B * HV)

    def ogrid(m):
        return (triton.cdiv(V, m["BV"]), *cgrid)

    launch(configs.o_fwd, delta_o_fwd_kernel, ogrid, q, k, gcum, Aqk if Aqk is not None else o, h, un, o,
           meta.cu, meta.chunk_indices, T, scale, GATE=gid, **common)  # fmt: skip
    return o, (ht if want_final else None), (h if save else None), (vnew if save else None)
