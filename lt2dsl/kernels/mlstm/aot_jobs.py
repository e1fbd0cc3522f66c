"""sm_90 compile jobs of the mLSTM kernels (`common.aot`): the chunked forward and backward at the
decay family's launch shape (`decay.aot_jobs.DIMS`, bf16 inputs, fp32 gates and stabilisers) with
an initial and a final state, every autotune config; the stabiliser's routing kernel and the
token-recurrent decode kernel at their launch code's fixed launches. Spills are bounded at
MAX_STACK bytes per thread: registers decide how many programs share an SM (the output and dv
kernels at 166 / 164 registers per thread at 4 warps, three programs per SM)."""

from __future__ import annotations

import triton

from lt2dsl.kernels.common.aot import Job, jit_of, tuned_jobs
from lt2dsl.kernels.mlstm import chunk, chunk_bwd, fused_recurrent, stabiliser_triton

from ..common.tiles import block
from ..decay.aot_jobs import DIMS, SCALARS, K, V, decay_jobs

MAX_STACK = 512
BF16 = {"q", "k", "v", "o", "do", "Cs", "dnum", "dCs", "dv", "dq", "dk", "ds_scr"}
META = {n: DIMS[n] for n in ("H", "K", "V", "BT", "BK", "BV", "IS_VARLEN", "PREC")}


def _jobs(name, kernel, cex, launch=None) -> list[Job]:
    fp32 = {p.name for p in jit_of(kernel).params} - BF16
    return decay_jobs(name, kernel, cex, fp32=fp32, launch=launch, max_stack=MAX_STACK)


def _forward() -> list[Job]:
    out = _jobs("mlstm/stab", chunk.fwd_stab_kernel, dict(H=16, BT=64, BC=64, HAS_H0=True, IS_VARLEN=False),
                launch=(4, 3))  # fmt: skip
    out += _jobs("mlstm/state", chunk.fwd_state_kernel, dict(META, HAS_H0=True))
    # `chunk_mlstm_fwd`: 16-bit inputs take value tiles up to O_BV_CAP wide
    return out + _jobs("mlstm/output", chunk.fwd_o_kernel, dict(META, BV=block(V, chunk.O_BV_CAP)))


def _backward() -> list[Job]:
    prep = {n: META[n] for n in ("H", "V", "BT", "BV", "K", "BK")}
    out = _jobs("mlstm/prep", chunk_bwd.bwd_prep_kernel, prep)
    weights = {n: META[n] for n in ("H", "K", "BT", "BK", "IS_VARLEN")}
    out += _jobs("mlstm/dh-weights", chunk_bwd.bwd_weights_kernel, weights, launch=(4, 3))
    out += _jobs("mlstm/dh", chunk_bwd.bwd_dh_kernel, dict(META, HAS_DHT=True, STORE_DH0=True))
    out += _jobs("mlstm/dv", chunk_bwd.bwd_dv_kernel, META)
    # dq/dk take key tiles up to 128 wide
    return out + _jobs("mlstm/dqk", chunk_bwd.bwd_dqk_kernel, dict(META, BK=block(K, 128)))


def _route_and_decode() -> list[Job]:
    """`route_and_finish` (2048 tokens a step, 16 warps, one key block at K = 128) and the decode
    kernel (`fused_recurrent`: the whole key, 32 value columns a program)."""
    nk = triton.cdiv(K, block(K, 128))
    route = dict(H=16, NK=nk, BL=2048, HAS_M0=True, HAS_DMT=True, IS_VARLEN=False)
    ptrs = {p.name: "*fp32" for p in stabiliser_triton.route_kernel.params} | {"R": "*fp64"}
    route["cu_seqlens"] = None
    kernel = stabiliser_triton.route_kernel
    out = tuned_jobs("mlstm/route", kernel, ptrs, SCALARS, route, launch=(16, 3), max_stack=MAX_STACK)
    rec = dict(H=16, K=K, V=V, BK=triton.next_power_of_2(K), BV=min(32, triton.next_power_of_2(V)))
    rec.update(HAS_H0=True, IS_VARLEN=False)
    return out + _jobs("mlstm/recurrent", fused_recurrent.fused_recurrent_kernel, rec, launch=(4, 3))


def jobs() -> list[Job]:
    return _forward() + _backward() + _route_and_decode()
