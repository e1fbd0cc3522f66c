"""Triton kernels of the fused elementwise activations: the GDN gates and SwiGLU.

* `gdn_gate`: from the raw projections a, b `[M, HV]` (any row stride) and A_log, dt_bias `[HV]`:
  g = −exp(A_log) · softplus(a + dt_bias) and β = s · σ(b), fp32 `[M, HV]` (mixers.md §5(a)).
  softplus follows torch (threshold 20, log1p through Kahan's trick: Triton has no log1p). The
  backward writes da, db and one partial row of dA_log, d dt_bias per program.
* `mamba2_gate`: from the raw dt projection a `[M, H]` and the conv output's heads x `[M, H, P]`
  (any row and head strides) and A_log, dt_bias `[H]`: dt = softplus(a + dt_bias), the core's
  value v = dt · x in x's dtype and log decay g = −exp(A_log) · dt, fp32 `[M, H]` (mixers.md §7(a)),
  in one launch (inference: no backward).
* `swiglu`: y = SiLU(a) ⊙ b over `[M, F]` tiles (a, b may be column slices of one GEMM output).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import configs, n_programs, pow2


@triton.jit
def _softplus(z):
    """(softplus(z), σ(z)) with torch's threshold: z above 20 passes through (derivative 1)."""
    u = tl.exp(tl.minimum(z, 20.0))
    w = 1.0 + u
    # log1p(u) = log(w) · u / (w − 1) exactly when w rounds away from 1 (Kahan)
    one = w == 1.0
    lp = tl.where(one, u, tl.log(w) * (u / tl.where(one, 1.0, w - 1.0)))
    big = z > 20.0
    return tl.where(big, z, lp), tl.where(big, 1.0, u / w)


@triton.autotune(configs(4, 8), key=["BH"])
@triton.jit
def gdn_gate_fwd_kernel(
    a, b, A_log, dt_bias, g, beta, M, HV, sa, sb, beta_scale, BM: tl.constexpr, BH: tl.constexpr
):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BH)
    m_h = cols < HV
    m = (rows < M)[:, None] & m_h[None, :]
    b_A = tl.exp(tl.load(A_log + cols, mask=m_h, other=0.0).to(tl.float32))
    b_dt = tl.load(dt_bias + cols, mask=m_h, other=0.0).to(tl.float32)
    b_a = tl.load(a + rows[:, None] * sa + cols[None, :], mask=m, other=0.0).to(tl.float32)
    b_b = tl.load(b + rows[:, None] * sb + cols[None, :], mask=m, other=0.0).to(tl.float32)
    sp, _ = _softplus(b_a + b_dt[None, :])
    p = rows[:, None] * HV + cols[None, :]
    tl.store(g + p, -b_A[None, :] * sp, mask=m)
    tl.store(beta + p, tl.sigmoid(b_b) * beta_scale, mask=m)


@triton.autotune(configs(4, 8), key=["BH"])
@triton.jit
def gdn_gate_bwd_kernel(
    a, b, A_log, dt_bias, dg, dbeta, da, db, dA_part, ddt_part, M, HV, sa, sb, beta_scale, blocks_per_prog,
    BM: tl.constexpr, BH: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BH)
    m_h = cols < HV
    b_A = tl.exp(tl.load(A_log + cols, mask=m_h, other=0.0).to(tl.float32))
    b_dt = tl.load(dt_bias + cols, mask=m_h, other=0.0).to(tl.float32)
    acc_A = tl.zeros([BH], dtype=tl.float32)
    acc_dt = tl.zeros([BH], dtype=tl.float32)
    for blk in range(blocks_per_prog):
        rows = (pid * blocks_per_prog + blk).to(tl.int64) * BM + tl.arange(0, BM)
        m = (rows < M)[:, None] & m_h[None, :]
        p = rows[:, None] * HV + cols[None, :]
        b_a = tl.load(a + rows[:, None] * sa + cols[None, :], mask=m, other=0.0).to(tl.float32)
        b_b = tl.load(b + rows[:, None] * sb + cols[None, :], mask=m, other=0.0).to(tl.float32)
        b_dg = tl.load(dg + p, mask=m, other=0.0).to(tl.float32)
        b_dbeta = tl.load(dbeta + p, mask=m, other=0.0).to(tl.float32)
        sp, sig = _softplus(b_a + b_dt[None, :])
        # g = −A · sp: ∂g/∂a = −A · σ(a + dt_bias), ∂g/∂A_log = g
        b_da = -b_dg * b_A[None, :] * sig
        acc_A += tl.sum(-b_dg * b_A[None, :] * sp, axis=0)
        acc_dt += tl.sum(b_da, axis=0)
        s = tl.sigmoid(b_b)
        tl.store(da + p, b_da.to(da.dtype.element_ty), mask=m)
        tl.store(db + p, (b_dbeta * beta_scale * s * (1.0 - s)).to(db.dtype.element_ty), mask=m)
    tl.store(dA_part + pid * HV + cols, acc_A, mask=m_h)
    tl.store(ddt_part + pid * HV + cols, acc_dt, mask=m_h)


def _gate_blocks(HV: int) -> tuple[int, int]:
    BH = pow2(HV)
    return max(1, min(256, 8192 // BH)), BH


def gdn_gate_fwd(
    a2: torch.Tensor, b2: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, beta_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """a2, b2 `[M, HV]` (unit column stride) → g, β `[M, HV]` fp32."""
    M, HV = a2.shape
    g = torch.empty(M, HV, dtype=torch.float32, device=a2.device)
    beta = torch.empty_like(g)
    BM, BH = _gate_blocks(HV)
    if M:
        gdn_gate_fwd_kernel[(triton.cdiv(M, BM),)](
            a2, b2, A_log, dt_bias, g, beta, M, HV, a2.stride(0), b2.stride(0), beta_scale, BM=BM, BH=BH
        )
    return g, beta


def gdn_gate_bwd(
    dg: torch.Tensor,
    dbeta: torch.Tensor,
    a2: torch.Tensor,
    b2: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    beta_scale: float,
):
    """(da, db `[M, HV]` in a's / b's dtype, dA_log, d dt_bias `[HV]` in their dtypes)."""
    M, HV = a2.shape
    dg, dbeta = dg.contiguous(), dbeta.contiguous()
    da = torch.empty(M, HV, dtype=a2.dtype, device=a2.device)
    db = torch.empty(M, HV, dtype=b2.dtype, device=a2.device)
    BM, BH = _gate_blocks(HV)
    n_blocks = triton.cdiv(M, BM)
    P = max(1, min(n_blocks, n_programs(a2.device)))
    per = triton.cdiv(n_blocks, P) if n_blocks else 0
    # every program writes its partial row (no fill needed unless nothing runs)
    alloc = torch.empty if M else torch.zeros
    dA_part = alloc(P, HV, dtype=torch.float32, device=a2.device)
    ddt_part = alloc(P, HV, dtype=torch.float32, device=a2.device)
    if M:
        gdn_gate_bwd_kernel[(P,)](
            a2, b2, A_log, dt_bias, dg, dbeta, da, db, dA_part, ddt_part, M, HV, a2.stride(0), b2.stride(0),
            beta_scale, per,
            BM=BM, BH=BH,
        )  # fmt: skip
    return da, db, dA_part.sum(0).to(A_log.dtype), ddt_part.sum(0).to(dt_bias.dtype)


GATE_WARPS = 4


@triton.jit
def mamba2_gate_fwd_kernel(
    a, x, A_log, dt_bias, v, g, H, sa, sxm, sxh, P: tl.constexpr, BH: tl.constexpr, BP: tl.constexpr,
):  # fmt: skip
    """Grid (M rows, head blocks of BH): row m's heads → v `[M, H, P]` (contiguous) and g `[M, H]`."""
    i_m, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_h = i_h * BH + tl.arange(0, BH)
    o_p = tl.arange(0, BP)
    m_h = o_h < H
    b_A = tl.exp(tl.load(A_log + o_h, mask=m_h, other=0.0).to(tl.float32))
    b_dt = tl.load(dt_bias + o_h, mask=m_h, other=0.0).to(tl.float32)
    b_a = tl.load(a + i_m * sa + o_h, mask=m_h, other=0.0).to(tl.float32)
    dt, _ = _softplus(b_a + b_dt)
    tl.store(g + i_m * H + o_h, dt * -b_A, mask=m_h)
    m = m_h[:, None] & (o_p < P)[None, :]
    b_x = tl.load(x + i_m * sxm + o_h[:, None] * sxh + o_p[None, :], mask=m, other=0.0).to(tl.float32)
    p_v = v + (i_m * H + o_h[:, None]) * P + o_p[None, :]
    tl.store(p_v, (dt[:, None] * b_x).to(v.dtype.element_ty), mask=m)


def mamba2_gate_block(H: int, P: int) -> tuple[int, int]:
    """(BH, BP): heads per program (a tile of at most 4096 elements) and the padded head dim."""
    BP = pow2(P)
    return max(1, min(pow2(H), 4096 // BP)), BP


def mamba2_gate_fwd(
    a2: torch.Tensor, x3: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """a2 `[M, H]`, x3 `[M, H, P]` (unit last strides) → (v `[M, H, P]` contiguous in x's dtype,
    g `[M, H]` fp32)."""
    M, H, P = x3.shape
    v = torch.empty(M, H, P, dtype=x3.dtype, device=x3.device)
    g = torch.empty(M, H, dtype=torch.float32, device=x3.device)
    if M * H * P == 0:
        return v, g
    BH, BP = mamba2_gate_block(H, P)
    mamba2_gate_fwd_kernel[(M, triton.cdiv(H, BH))](
        a2, x3, A_log, dt_bias, v, g, H, a2.stride(0), x3.stride(0), x3.stride(1), P=P, BH=BH, BP=BP,
        num_warps=GATE_WARPS,
    )  # fmt: skip
    return v, g


@triton.autotune(configs(4, 8), key=["BF"])
@triton.jit
def swiglu_fwd_kernel(a, b, y, M, F, sa, sb, BM: tl.constexpr, BF: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BF + tl.arange(0, BF)
    m = (rows < M)[:, None] & (cols < F)[None, :]
    b_a = tl.load(a + rows[:, None] * sa + cols[None, :], mask=m, other=0.0).to(tl.float32)
    b_b = tl.load(b + rows[:, None] * sb + cols[None, :], mask=m, other=0.0).to(tl.float32)
    b_y = b_a * tl.sigmoid(b_a) * b_b
    tl.store(y + rows[:, None] * F + cols[None, :], b_y.to(y.dtype.element_ty), mask=m)


@triton.autotune(configs(4, 8), key=["BF"])
@triton.jit
def swiglu_bwd_kernel(a, b, dy, da, db, M, F, sa, sb, BM: tl.constexpr, BF: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BF + tl.arange(0, BF)
    m = (rows < M)[:, None] & (cols < F)[None, :]
    b_a = tl.load(a + rows[:, None] * sa + cols[None, :], mask=m, other=0.0).to(tl.float32)
    b_b = tl.load(b + rows[:, None] * sb + cols[None, :], mask=m, other=0.0).to(tl.float32)
    p = rows[:, None] * F + cols[None, :]
    b_dy = tl.load(dy + p, mask=m, other=0.0).to(tl.float32)
    s = tl.sigmoid(b_a)
    tl.store(da + p, (b_dy * b_b * s * (1.0 + b_a * (1.0 - s))).to(da.dtype.element_ty), mask=m)
    tl.store(db + p, (b_dy * b_a * s).to(db.dtype.element_ty), mask=m)


def _swiglu_blocks(F: int) -> tuple[int, int]:
    BF = min(1024, pow2(F))
    return max(1, 4096 // BF), BF


def swiglu_fwd(a2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """a2, b2 `[M, F]` (unit column stride) → y `[M, F]` contiguous in a's dtype."""
    M, F = a2.shape
    y = torch.empty(M, F, dtype=a2.dtype, device=a2.device)
    BM, BF = _swiglu_blocks(F)
    if M * F:
        swiglu_fwd_kernel[(triton.cdiv(M, BM), triton.cdiv(F, BF))](
            a2, b2, y, M, F, a2.stride(0), b2.stride(0), BM=BM, BF=BF
        )
    return y


def swiglu_bwd(dy: torch.Tensor, a2: torch.Tensor, b2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) `[M, F]` in a's / b's dtypes."""
    M, F = a2.shape
    dy = dy.contiguous()
    da = torch.empty(M, F, dtype=a2.dtype, device=a2.device)
    db = torch.empty(M, F, dtype=b2.dtype, device=a2.device)
    BM, BF = _swiglu_blocks(F)
    if M * F:
        swiglu_bwd_kernel[(triton.cdiv(M, BM), triton.cdiv(F, BF))](
            a2, b2, dy, da, db, M, F, a2.stride(0), b2.stride(0), BM=BM, BF=BF
        )
    return da, db
