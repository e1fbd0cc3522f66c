"""Host side of the delta-rule backward: the reverse state scan's passes, then the per-chunk input
gradients.

State (`scan_bwd`): Pᵀ dO for all chunks at once, W recomputed, the reverse scan with two dots on
its sequential path, then Y = Tᵀ dU' for all chunks at once. Inputs (`grad`): the C x C kernel,
the per-(K tile, chunk) kernel at the recipe's key tile, and the dβ / dg finalize (KDA: its gated
intra-chunk kernel, `kda_grad`, instead of the finalize). Scratch between these kernels is fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lt2dsl.kernels.delta import configs
from lt2dsl.kernels.delta.grad import delta_grad_cc_kernel, delta_grad_final_kernel, delta_grad_k_kernel
from lt2dsl.kernels.delta.kda_grad import kda_grad_intra_kernel
from lt2dsl.kernels.delta.launch import (
    BT,
    GATE_IDS,
    ChunkMeta,
    dot_mode,
    empty,
    launch,
    pow2,
    split_mode,
    state_bk,
    state_gate,
)
from lt2dsl.kernels.delta.recipe import DeltaRecipe
from lt2dsl.kernels.delta.scan_bwd import (
    delta_dh_bwd_kernel,
    delta_du0_kernel,
    delta_w_kernel,
    delta_y_kernel,
)

# KDA's intra-chunk gradient kernel read-modify-writes dq, dk and dg, so it is not autotuned: BK 32
# at 4 warps spills 72 B per thread offline at K = 128 (BK 16: 520-780 B), and BK 32 or 64 at 8
# warps ran slower on the GPU.
KDA_BK, KDA_WARPS = 32, 4
TRITON_DT = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def state_bwd(q, k, gcum, beta, Ainv, Aqk, do, dht, scale, gate, meta: ChunkMeta, want_dh0):
    """The reverse scan's passes: per-chunk state gradients dh `[chunks, HV, K, V]`, Y = Tᵀ dU'
    `[B, T, HV, V]` (fp32) and the initial-state gradient (None unless `want_dh0`)."""
    B, T, H, K = k.shape
    HV, V = do.shape[2], do.shape[3]
    dh = empty(k, ChunkMeta.max_chunks(B, T, meta.N, meta.varlen), HV, K, V)
    dh0 = empty(do, meta.N, HV, K, V, dtype=torch.float32) if want_dh0 else dh
    dt = k.dtype
    gid = state_gate(gate)
    common = dict(H=H, HV=HV, K=K, BT=BT, BK=state_bk(K), GATE=gid, IS_VARLEN=meta.varlen, DOT=dot_mode(dt),
                  PREC=split_mode(dt))  # fmt: skip
    cgrid = meta.chunk_grid(B * HV)
    fixed = {"BV": min(32, pow2(V))}

    def ugrid(m):
        return (triton.cdiv(V, m["BV"]), *cgrid)

    def grid(m):
        return (triton.cdiv(V, m["BV"]), meta.N * HV)

    du0 = empty(do, *do.shape, dtype=torch.float32)  # Pᵀ dO, then Y (the Y pass writes it)
    scores = Aqk if Aqk is not None and Aqk.numel() else do
    launch(configs.du0, delta_du0_kernel, ugrid, q, k, gcum, scores, do, du0, meta.cu, meta.chunk_indices, T,
           scale, V=V, fixed=fixed, **common)  # fmt: skip
    w = empty(k, B * T, HV, K)
    launch(configs.w_bwd, delta_w_kernel, cgrid, k, gcum, beta, Ainv, w, meta.cu, meta.chunk_indices, T,
           **common)  # fmt: skip
    # dU' goes to `du`, then Y = Tᵀ dU' into du0's buffer (read by the scan before): no autotuned
    # kernel reads a buffer it writes (each runs several times while autotuning).
    du = empty(do, *do.shape, dtype=torch.float32)
    # DeltaNet's reverse scan has no gate code, and takes 16-bit operands for 16-bit inputs
    if gate == "none":
        scan = dict(common, GATE=GATE_IDS[gate], D16=split_mode(dt))
    else:
        scan = dict(common, D16=False)
    launch(configs.dh_bwd, delta_dh_bwd_kernel, grid, q, k, w, gcum, do, du0, dht if dht is not None else do,
           dh, du, dh0, meta.cu, meta.chunk_offsets, T, scale, V=V, USE_DHT=dht is not None,
           STORE_DH0=want_dh0, fixed=fixed, **scan)  # fmt: skip
    Y = du0
    launch(configs.y_bwd, delta_y_kernel, ugrid, Ainv, du, Y, meta.cu, meta.chunk_indices, T, HV=HV, V=V,
           BT=BT, IS_VARLEN=meta.varlen, DOT=dot_mode(dt), PREC=split_mode(dt), DT=TRITON_DT[dt],
           fixed=fixed)  # fmt: skip
    return dh, Y, (dh0 if want_dh0 else None)


def grad_chunks(q, k, v, gcum, beta, h, dh, vnew, Y, do, scale, gate, meta: ChunkMeta, recipe: DeltaRecipe):
    """dq, dk `[B*T, HV, K]` per value head, dv, dβ `[B*T, HV]` and dg (fp32) of a chunk pass.

    dq, dk come in the input dtype when nothing is added to them afterwards (no grouped value
    heads to sum, no KDA intra-chunk pass), else in fp32.
    """
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    dt, f32 = k.dtype, torch.float32
    gid = GATE_IDS[gate]
    grid = meta.chunk_grid(B * HV)
    common = dict(H=H, HV=HV, K=K, V=V, BT=BT, GATE=gid, IS_VARLEN=meta.varlen, DOT=dot_mode(dt),
                  PREC=split_mode(dt))  # fmt: skip
    dv = empty(v, *v.shape)
    MA, MB = empty(q, B * T, HV, BT, dtype=f32), empty(q, B * T, HV, BT, dtype=f32)
    dbeta_p = empty(q, B * T, HV, dtype=f32)
    db_p = empty(q, B * T, HV, dtype=f32) if gate == "scalar" else dbeta_p
    launch(configs.grad_cc, delta_grad_cc_kernel, grid, q, k, v, gcum, beta, vnew, Y, do, dv, MA, MB, dbeta_p,
           db_p, meta.cu, meta.chunk_indices, T, scale, BK=pow2(K), fixed={"BV": min(64, pow2(V))},
           **common)  # fmt: skip
    BKs = min(recipe.grad_bk, pow2(K))
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
    # a head dim below 32 narrows the tile under every list's key; the 32-wide list fits it
    tuned = configs.grad_k.get(BKs, configs.grad_k[32])
    launch(tuned, delta_grad_k_kernel, (NK, *grid), q, k, gcum, beta, h, dh, vnew, Y, do, MA, MB, dq, dk,
           dg if gate == "channel" else dq, part, part_sds, meta.cu, meta.chunk_indices, T, B * T, NC, scale,
           BK=BKs, fixed={"BV": min(32, pow2(V))}, **common)  # fmt: skip
    if gate == "channel":
        dbeta_intra = _kda_intra_bwd(q, k, gcum, beta, MA, MB, dq, dk, dg, scale, meta, recipe)
        return dq, dk, dv, dbeta_p + part[..., 0].sum(0) + dbeta_intra, dg
    dbeta = empty(q, B * T, HV, dtype=f32)
    db = dg if gate == "scalar" else dbeta
    delta_grad_final_kernel[grid](gcum, beta, dbeta_p, db_p, part, part_sds, dbeta, db, meta.cu,
                                  meta.chunk_indices, T, B * T, NC, scale, HV=HV, K=K, BT=BT, NK=NK, GATE=gid,
                                  IS_VARLEN=meta.varlen)  # fmt: skip
    return dq, dk, dv, dbeta, (dg if gate == "scalar" else None)


def _kda_intra_bwd(q, k, gcum, beta, MA, MB, dq, dk, dg, scale, meta: ChunkMeta, recipe: DeltaRecipe):
    """KDA's gated intra-chunk gradient terms, added into dq, dk, dg; returns the dβ part."""
    B, T, H, K = k.shape
    HV = beta.shape[-1]
    BKs = min(KDA_BK, pow2(K))
    NK = triton.cdiv(K, BKs)
    dbeta_intra = empty(q, NK, B * T, HV, dtype=torch.float32)
    launch(None, kda_grad_intra_kernel, (NK, *meta.chunk_grid(B * HV)), q, k, gcum, beta, MA, MB, dq, dk, dg,
           dbeta_intra, meta.cu, meta.chunk_indices, T, B * T, scale, H=H, HV=HV, K=K, BT=BT, BK=BKs,
           IS_VARLEN=meta.varlen, DOT=dot_mode(k.dtype), SPAN=recipe.kda_diag_span,
           fixed={"num_warps": KDA_WARPS, "num_stages": 1})  # fmt: skip
    return dbeta_intra.sum(0)
