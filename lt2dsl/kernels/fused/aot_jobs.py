"""sm_90 compile jobs of the fused elementwise kernels (`common.aot`): add + RMSNorm (with a
sandwich block's branch norm before the add and without), the gated
RMSNorm of a mixer's output, the causal conv + SiLU (with the per-head L2 norm of GDN's q, k and
without), SwiGLU and GDN's gate, forward and backward, every autotune config; the decode step of
the q, k, v convs and the RoPE of q and k (with the cache writes and without) at their fixed
launch, RetNet's xPos of q and k and Mamba2's gates at theirs. Shapes of a 2048-wide model with
16 heads of 128 (the examples'), bf16 activations; tiles as the launch code computes them for
those shapes."""

from __future__ import annotations

from lt2dsl.kernels.common.aot import Job, jit_of, tuned_jobs
from lt2dsl.kernels.fused import triton_act as A
from lt2dsl.kernels.fused import triton_conv as C
from lt2dsl.kernels.fused import triton_conv_step as CS
from lt2dsl.kernels.fused import triton_norm as N
from lt2dsl.kernels.fused import triton_rope as R
from lt2dsl.kernels.fused.common import pow2

DIM, HEADS, HEAD_DIM, HIDDEN, WIDTH = 2048, 16, 128, 5632, 4
INTS = ("M", "HV", "F", "sa", "sb", "blocks_per_prog", "T", "C", "sxb", "sxt", "shb", "shc", "n_t", "D",
        "stride_x", "stride_r", "stride_dn", "stride_ds", "rows_per_prog", "n_rows", "nsub", "so", "sg",
        "group", "nseg", "C0", "C1", "C2", "sx0", "sx1", "sx2", "sh0b", "sh1b", "sh2b", "sh0c", "sh1c",
        "sh2c", "H0", "H1", "sx0b", "sx0t", "sx0h", "sx1b", "sx1t", "sx1h", "scb", "sct",
        "stride_y", "Hq", "sqb", "sqh", "Hk", "skb", "skh", "kcb", "kch", "kcl", "svb", "svh", "vcb", "vch",
        "vcl", "L", "spb", "spt", "H", "sxm", "sxh")  # fmt: skip
SCALARS = {n: "i32" for n in INTS} | {"beta_scale": "fp32", "eps": "fp32", "eps1": "fp32", "eps2": "fp32"}
FP32 = {"rstd", "dw_part", "db_part", "A_log", "dt_bias", "beta", "dbeta", "dA_part", "ddt_part", "c", "s"}


def _jobs(name, kernel, cex) -> list[Job]:
    ptrs = {p.name: "*fp32" for p in jit_of(kernel).params if p.name in FP32}
    if kernel in (A.gdn_gate_fwd_kernel, A.gdn_gate_bwd_kernel):
        ptrs |= {"g": "*fp32", "dg": "*fp32"}
    return tuned_jobs(f"fused/{name}", kernel, ptrs, SCALARS, cex, aligned=(), default_ptr="*bf16")


def _norms() -> list[Job]:
    out = _jobs("add_rmsnorm_fwd", N.add_rmsnorm_fwd_kernel, {"BD": pow2(DIM)})
    out += _jobs("norm_add_rmsnorm_fwd", N.norm_add_rmsnorm_fwd_kernel, {"BD": pow2(DIM)})
    for has_ds in (True, False):
        cex = {"BD": pow2(DIM), "HAS_DS": has_ds, **({} if has_ds else {"ds": None})}
        out += _jobs(f"add_rmsnorm_bwd-ds{has_ds:d}", N.add_rmsnorm_bwd_kernel, cex)
    BG, BR = N._rows_block(HEAD_DIM)
    for act in (1, 2):  # `ACT_CODES`: SiLU and sigmoid output gates
        for norm_first in (True, False):
            cex = dict(BR=BR, BG=BG, ACT=act, NORM_FIRST=norm_first)
            tag = f"a{act}-n{norm_first:d}"
            out += _jobs(f"gated_rmsnorm_fwd-{tag}", N.gated_rmsnorm_fwd_kernel, cex)
            out += _jobs(f"gated_rmsnorm_bwd-{tag}", N.gated_rmsnorm_bwd_kernel, cex)
    return out


def _conv() -> list[Job]:
    """`conv_silu_fwd`/`_bwd` at T = 8192 over the 3 x 2048 q, k, v channels: one head a program
    with the L2 norm, else 128 channels; the history and the bias present."""
    out = []
    for head_dim in (HEAD_DIM, 0):
        BT, BC, HD = C._blocks(8192, 3 * DIM, head_dim)
        cex = dict(W=WIDTH, BT=BT, BC=BC, HD=HD, HAS_H=True, HAS_B=True, L2=head_dim > 0)
        out += _jobs(f"conv_fwd-l2{head_dim > 0:d}", C.conv_silu_fwd_kernel, cex)
        out += _jobs(f"conv_bwd_pre-l2{head_dim > 0:d}", C.conv_silu_bwd_pre_kernel, cex)
    BT, BC, HD = C._blocks(8192, 3 * DIM, 0)
    cex = dict(W=WIDTH, BT=BT, BC=BC, HD=HD, HAS_H=True)
    return out + _jobs("conv_bwd_dx", C.conv_silu_bwd_dx_kernel, cex)


def _acts() -> list[Job]:
    BM, BF = A._swiglu_blocks(HIDDEN)
    out = _jobs("swiglu_fwd", A.swiglu_fwd_kernel, {"BM": BM, "BF": BF})
    out += _jobs("swiglu_bwd", A.swiglu_bwd_kernel, {"BM": BM, "BF": BF})
    BM, BH = A._gate_blocks(HEADS)
    out += _jobs("gdn_gate_fwd", A.gdn_gate_fwd_kernel, {"BM": BM, "BH": BH})
    return out + _jobs("gdn_gate_bwd", A.gdn_gate_bwd_kernel, {"BM": BM, "BH": BH})


def _decode() -> list[Job]:
    """The q, k, v convs' step (L2 on q, k; one head a program) and one plain conv with a bias (128
    channels a program); RoPE of q and k (16 heads of 128) and of the DSA indexer's (4 heads of 64,
    the first 32 channels turned)."""
    ptrs = {p.name: "*fp32" for p in jit_of(R.rope_fwd_kernel).params if p.name in FP32}
    out = []
    for tag, l2, bias in (("qkv-l2", (True, True, False), False), ("one-bias", (False,) * 3, True)):
        BC, HD = CS.step_block([HEAD_DIM if f else 0 for f in l2], [DIM] * 3)
        cex = dict(W=WIDTH, BC=BC, HD=HD) | {f"HB{i}": bias for i in range(3)}
        cex |= {f"L2_{i}": f for i, f in enumerate(l2)}
        out += tuned_jobs(f"fused/conv_step-{tag}", CS.conv_silu_step_kernel, {}, SCALARS, cex,
                          launch=(CS.STEP_WARPS, 1), aligned=(), default_ptr="*bf16")  # fmt: skip
    for tag, heads, D, rot in (("qk", HEADS, HEAD_DIM, HEAD_DIM), ("index", 4, 64, 32)):
        BH, BD = R.rope_block(heads, D)
        cex = dict(R=rot, BH=BH, BD=BD, D=D)
        out += tuned_jobs(f"fused/rope-{tag}", R.rope_fwd_kernel, ptrs, SCALARS, cex,
                          launch=(R.ROPE_WARPS, 1), aligned=(), default_ptr="*bf16")  # fmt: skip
    return out + _rope_cache() + _xpos() + _mamba2_gate()


def _xpos() -> list[Job]:
    """RetNet's xPos of q and k (`xpos_fwd_kernel`): 16 heads of 128, tables fp32, positions int64."""
    BH, BD = R.rope_block(HEADS, HEAD_DIM)
    ptrs = {"c": "*fp32", "s": "*fp32", "pos": "*i64"}
    return tuned_jobs("fused/xpos", R.xpos_fwd_kernel, ptrs, SCALARS, dict(BH=BH, BD=BD, D=HEAD_DIM),
                      launch=(R.ROPE_WARPS, 1), aligned=(), default_ptr="*bf16")  # fmt: skip


def _mamba2_gate() -> list[Job]:
    """Mamba2's gates (`mamba2_gate_fwd_kernel`) of mamba2_780m: 48 heads of 64, bf16 parameters,
    g fp32."""
    BH, BP = A.mamba2_gate_block(48, 64)
    return tuned_jobs("fused/mamba2_gate", A.mamba2_gate_fwd_kernel, {"g": "*fp32"}, SCALARS,
                      dict(P=64, BH=BH, BP=BP), launch=(A.GATE_WARPS, 1), aligned=(),
                      default_ptr="*bf16")  # fmt: skip


def _rope_cache() -> list[Job]:
    """RoPE with the cache writes (`rope_cache_kernel`): q, k and v of 16 heads of 128 (a window's
    ring too); DSA's indexer, 4 query heads of 64 and one LayerNorm-ed key, 32 channels turned."""
    ptrs = {"c": "*fp32", "s": "*fp32", "pos": "*i64"}
    out = []
    for tag, heads, D, rot, ring, norm in (("kv", HEADS, HEAD_DIM, HEAD_DIM, False, False),
                                           ("kv-ring", HEADS, HEAD_DIM, HEAD_DIM, True, False),
                                           ("index", 4, 64, 32, False, True)):  # fmt: skip
        BH, BD = R.rope_block(heads, D)
        cex = dict(R=rot, BH=BH, BD=BD, D=D, RING=ring, NORM=norm)
        out += tuned_jobs(f"fused/rope_cache-{tag}", R.rope_cache_kernel, ptrs, SCALARS, cex,
                          launch=(R.ROPE_WARPS, 1), aligned=(), default_ptr="*bf16")  # fmt: skip
    return out


def jobs() -> list[Job]:
    return _norms() + _conv() + _acts() + _decode()
