"""Triton kernels of the fused norms: residual add + RMSNorm, and the gated (grouped) RMSNorm.

* `add_rmsnorm`: s = x + r (rounded to x's dtype, as the unfused add), n = RMSNorm(s) · γ, one
  row of D per program; saves rstd `[M]` (fp32) for the backward, which walks blocks of rows
  per program and writes one partial dγ row per program (summed on the host, deterministic).
* `norm_add_rmsnorm` (inference): the same with r = RMSNorm(y) · γ₁ first, a sandwich block's
  branch norm (rounded to the activation dtype, as the unfused norm's output).
* `gated_rmsnorm`: rows of `group` channels inside `[M, L]` (L a multiple of the weight length
  `dim`, `group` dividing `dim`); y = RMSNorm(o) · w ⊙ act(g) (fla, NORM_FIRST) or
  RMSNorm(o ⊙ act(g)) · w (Mamba2). A tile holds BR rows; the backward runs one grid column per
  weight segment, so each program's dw partial belongs to one segment.
All math in fp32; outputs in the output tensors' dtypes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import configs, n_programs, pow2

ACT_CODES = {None: 0, "silu": 1, "sigmoid": 2}


@triton.jit
def _act(x, ACT: tl.constexpr):
    """(act(x), act'(x)) for ACT 1 = SiLU, 2 = sigmoid."""
    s = tl.sigmoid(x)
    if ACT == 1:
        return x * s, s * (1.0 + x * (1.0 - s))
    return s, s * (1.0 - s)


@triton.autotune(configs(8, 4, 16), key=["BD"])
@triton.jit
def add_rmsnorm_fwd_kernel(x, r, w, s, n, rstd, stride_x, stride_r, D, eps, BD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BD)
    m = cols < D
    b_x = tl.load(x + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
    b_r = tl.load(r + row * stride_r + cols, mask=m, other=0.0).to(tl.float32)
    # the sum is rounded to the activation dtype first, as the unfused `h + y` is
    b_s = (b_x + b_r).to(s.dtype.element_ty)
    tl.store(s + row * D + cols, b_s, mask=m)
    b_s = b_s.to(tl.float32)
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_s * b_s, axis=0) / D + eps)
    tl.store(rstd + row, b_rstd)
    b_w = tl.load(w + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(n + row * D + cols, (b_s * b_rstd * b_w).to(n.dtype.element_ty), mask=m)


@triton.autotune(configs(8, 4, 16), key=["BD"])
@triton.jit
def add_rmsnorm_bwd_kernel(
    s, w, rstd, dn, ds, dx, dw_part, M, D, stride_dn, stride_ds, rows_per_prog,
    BD: tl.constexpr, HAS_DS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BD)
    m = cols < D
    b_w = tl.load(w + cols, mask=m, other=0.0).to(tl.float32)
    b_dw = tl.zeros([BD], dtype=tl.float32)
    row_start = pid.to(tl.int64) * rows_per_prog
    for i in range(rows_per_prog):
        row = row_start + i
        m_r = m & ((row + tl.zeros([BD], dtype=tl.int64)) < M)
        b_s = tl.load(s + row * D + cols, mask=m_r, other=0.0).to(tl.float32)
        b_dn = tl.load(dn + row * stride_dn + cols, mask=m_r, other=0.0).to(tl.float32)
        # rows past M (last program) read a valid rstd; their loads and stores are masked
        b_rstd = tl.load(rstd + tl.minimum(row, M - 1))
        b_xhat = b_s * b_rstd
        b_wdn = b_dn * b_w
        # d/ds of s·rstd(s): rstd · (u − ŝ · mean(u · ŝ)) with u = dn ⊙ γ
        b_dx = b_rstd * (b_wdn - b_xhat * (tl.sum(b_wdn * b_xhat, axis=0) / D))
        if HAS_DS:
            b_dx += tl.load(ds + row * stride_ds + cols, mask=m_r, other=0.0).to(tl.float32)
        tl.store(dx + row * D + cols, b_dx.to(dx.dtype.element_ty), mask=m_r)
        b_dw += b_dn * b_xhat
    tl.store(dw_part + pid * D + cols, b_dw, mask=m)


def add_rmsnorm_fwd(x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float):
    """x, r `[..., D]` (same shape and dtype) → (n, s) in x's dtype and rstd `[M]` fp32."""
    D = x.shape[-1]
    x2, r2 = x.reshape(-1, D), r.reshape(-1, D)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    r2 = r2 if r2.stride(-1) == 1 else r2.contiguous()
    M = x2.shape[0]
    s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = torch.empty_like(s)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    if M:
        add_rmsnorm_fwd_kernel[(M,)](
            x2, r2, weight, s, n, rstd, x2.stride(0), r2.stride(0), D, eps, BD=pow2(D)
        )
    return n, s, rstd


@triton.autotune(configs(8, 4, 16), key=["BD"])
@triton.jit
def norm_add_rmsnorm_fwd_kernel(x, y, w1, w2, s, n, stride_x, stride_y, D, eps1, eps2, BD: tl.constexpr):
    """A sandwich block's residual add (inference): s = x + RMSNorm(y) · γ₁, n = RMSNorm(s) · γ₂."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BD)
    m = cols < D
    b_y = tl.load(y + row * stride_y + cols, mask=m, other=0.0).to(tl.float32)
    b_w1 = tl.load(w1 + cols, mask=m, other=0.0).to(tl.float32)
    # the branch norm's output is rounded to the activation dtype, as the unfused norm's is
    b_r = (b_y * (1.0 / tl.sqrt(tl.sum(b_y * b_y, axis=0) / D + eps1)) * b_w1).to(s.dtype.element_ty)
    b_x = tl.load(x + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
    b_s = (b_x + b_r.to(tl.float32)).to(s.dtype.element_ty)
    tl.store(s + row * D + cols, b_s, mask=m)
    b_s = b_s.to(tl.float32)
    b_w2 = tl.load(w2 + cols, mask=m, other=0.0).to(tl.float32)
    b_n = b_s * (1.0 / tl.sqrt(tl.sum(b_s * b_s, axis=0) / D + eps2)) * b_w2
    tl.store(n + row * D + cols, b_n.to(n.dtype.element_ty), mask=m)


def norm_add_rmsnorm_fwd(x, y, w1, eps1: float, w2, eps2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y `[..., D]` (same shape and dtype) → (n, s) in x's dtype."""
    D = x.shape[-1]
    x2, y2 = x.reshape(-1, D), y.reshape(-1, D)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    y2 = y2 if y2.stride(-1) == 1 else y2.contiguous()
    s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = torch.empty_like(s)
    if x2.shape[0]:
        norm_add_rmsnorm_fwd_kernel[(x2.shape[0],)](
            x2, y2, w1, w2, s, n, x2.stride(0), y2.stride(0), D, eps1, eps2, BD=pow2(D)
        )
    return n, s


def add_rmsnorm_bwd(
    dn: torch.Tensor, ds: torch.Tensor | None, s: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
):
    """Gradients (dx = dr `[..., D]` in s's dtype, dγ `[D]` in γ's dtype)."""
    D = s.shape[-1]
    M = rstd.shape[0]
    dn2 = dn.reshape(-1, D)
    dn2 = dn2 if dn2.stride(-1) == 1 else dn2.contiguous()
    ds2 = None if ds is None else ds.reshape(-1, D)
    if ds2 is not None and ds2.stride(-1) != 1:
        ds2 = ds2.contiguous()
    dx = torch.empty(s.shape, dtype=s.dtype, device=s.device)
    P = max(1, min(M, n_programs(s.device)))
    rows = triton.cdiv(M, P) if M else 0
    # every program writes its partial row (no fill needed unless nothing runs)
    dw_part = (torch.empty if M else torch.zeros)(P, D, dtype=torch.float32, device=s.device)
    if M:
        add_rmsnorm_bwd_kernel[(P,)](
            s, weight, rstd, dn2, ds2, dx, dw_part, M, D, dn2.stride(0),
            0 if ds2 is None else ds2.stride(0), rows,
            BD=pow2(D), HAS_DS=ds2 is not None,
        )  # fmt: skip
    return dx, dw_part.sum(0).to(weight.dtype)


def _rows_block(group: int) -> tuple[int, int]:
    BG = pow2(group)
    return BG, max(1, min(64, 4096 // BG))


@triton.autotune(configs(4, 8, 2), key=["BG", "BR", "ACT", "NORM_FIRST"])
@triton.jit
def gated_rmsnorm_fwd_kernel(
    o, g, w, y, n_rows, nsub, so, sg, group, nseg, eps,
    BR: tl.constexpr, BG: tl.constexpr, ACT: tl.constexpr, NORM_FIRST: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BG)
    m = (rows < n_rows)[:, None] & (cols < group)[None, :]
    outer, sub = rows // nsub, rows % nsub
    b_o = tl.load(o + (outer * so + sub * group)[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
    b_w = tl.load(w + ((sub % nseg) * group)[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
    if ACT != 0:
        b_g = tl.load(g + (outer * sg + sub * group)[:, None] + cols[None, :], mask=m, other=0.0)
        b_a, _ = _act(b_g.to(tl.float32), ACT)
        if not NORM_FIRST:
            b_o = b_o * b_a
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_o * b_o, axis=1) / group + eps)
    b_y = b_o * b_rstd[:, None] * b_w
    if ACT != 0 and NORM_FIRST:
        b_y = b_y * b_a
    tl.store(y + rows[:, None] * group + cols[None, :], b_y.to(y.dtype.element_ty), mask=m)


@triton.autotune(configs(4, 8, 2), key=["BG", "BR", "ACT", "NORM_FIRST"])
@triton.jit
def gated_rmsnorm_bwd_kernel(
    o, g, w, dy, do, dg, dw_part, n_rows, nsub, so, sg, group, nseg, eps, blocks_per_prog,
    BR: tl.constexpr, BG: tl.constexpr, ACT: tl.constexpr, NORM_FIRST: tl.constexpr,
):  # fmt: skip
    pid, seg = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BG)
    mc = cols < group
    b_w = tl.load(w + seg * group + cols, mask=mc, other=0.0).to(tl.float32)
    b_dw = tl.zeros([BG], dtype=tl.float32)
    n_seg_rows = n_rows // nseg
    for blk in range(blocks_per_prog):
        i = (pid * blocks_per_prog + blk).to(tl.int64) * BR + tl.arange(0, BR)
        rows = seg + nseg * i
        m = (i < n_seg_rows)[:, None] & mc[None, :]
        outer, sub = rows // nsub, rows % nsub
        p_o = (outer * so + sub * group)[:, None] + cols[None, :]
        p_r = rows[:, None] * group + cols[None, :]
        b_o = tl.load(o + p_o, mask=m, other=0.0).to(tl.float32)
        b_dy = tl.load(dy + p_r, mask=m, other=0.0).to(tl.float32)
        if ACT != 0:
            p_g = (outer * sg + sub * group)[:, None] + cols[None, :]
            b_g = tl.load(g + p_g, mask=m, other=0.0).to(tl.float32)
            b_a, b_da = _act(b_g, ACT)
        if NORM_FIRST:
            b_rstd = 1.0 / tl.sqrt(tl.sum(b_o * b_o, axis=1) / group + eps)
            b_xhat = b_o * b_rstd[:, None]
            b_dn = b_dy
            if ACT != 0:
                b_dn = b_dy * b_a
                tl.store(dg + p_r, (b_dy * b_xhat * b_w * b_da).to(dg.dtype.element_ty), mask=m)
            b_dw += tl.sum(b_dn * b_xhat, axis=0)
            b_u = b_dn * b_w
            b_do = b_rstd[:, None] * (b_u - b_xhat * (tl.sum(b_u * b_xhat, axis=1) / group)[:, None])
        else:
            b_x = b_o * b_a
            b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=1) / group + eps)
            b_xhat = b_x * b_rstd[:, None]
            b_dw += tl.sum(b_dy * b_xhat, axis=0)
            b_u = b_dy * b_w
            b_dx = b_rstd[:, None] * (b_u - b_xhat * (tl.sum(b_u * b_xhat, axis=1) / group)[:, None])
            b_do = b_dx * b_a
            tl.store(dg + p_r, (b_dx * b_o * b_da).to(dg.dtype.element_ty), mask=m)
        tl.store(do + p_r, b_do.to(do.dtype.element_ty), mask=m)
    tl.store(dw_part + pid * (nseg * group) + seg * group + cols, b_dw, mask=mc)


def _gated_rows(o2: torch.Tensor, weight: torch.Tensor, group: int) -> tuple[int, int, int, int, int, int]:
    """(M, L, dim, nsub, nseg, n_rows) of o2 `[M, L]`: nsub groups per row of o2, nseg per weight
    `[dim]`, n_rows = M · nsub normalised rows."""
    M, L = o2.shape
    dim = weight.shape[0]
    nsub, nseg = L // group, dim // group
    return M, L, dim, nsub, nseg, M * nsub


def gated_rmsnorm_fwd(
    o2: torch.Tensor, g2: torch.Tensor | None, weight: torch.Tensor, eps: float, act: int, group: int,
    norm_first: bool,
) -> torch.Tensor:  # fmt: skip
    """o2, g2 `[M, L]` (unit column stride) → y `[M, L]` contiguous in weight's dtype."""
    M, L, _, nsub, nseg, n_rows = _gated_rows(o2, weight, group)
    y = torch.empty(M, L, dtype=weight.dtype, device=o2.device)
    BG, BR = _rows_block(group)
    if n_rows:
        gated_rmsnorm_fwd_kernel[(triton.cdiv(n_rows, BR),)](
            o2, g2, weight, y, n_rows, nsub, o2.stride(0), 0 if g2 is None else g2.stride(0), group,
            nseg, eps,
            BR=BR, BG=BG, ACT=act, NORM_FIRST=norm_first,
        )  # fmt: skip
    return y


def gated_rmsnorm_bwd(
    dy: torch.Tensor, o2: torch.Tensor, g2: torch.Tensor | None, weight: torch.Tensor, eps: float, act: int,
    group: int, norm_first: bool,
):  # fmt: skip
    """(do `[M, L]` in o's dtype, dg `[M, L]` in g's dtype or None, dw `[dim]` in weight's dtype)."""
    M, L, dim, nsub, nseg, n_rows = _gated_rows(o2, weight, group)
    dy = dy if dy.is_contiguous() else dy.contiguous()
    do = torch.empty(M, L, dtype=o2.dtype, device=o2.device)
    dg = None if g2 is None else torch.empty(M, L, dtype=g2.dtype, device=o2.device)
    BG, BR = _rows_block(group)
    n_blocks = triton.cdiv(n_rows // nseg, BR)
    P = max(1, min(n_blocks, triton.cdiv(n_programs(o2.device), nseg)))
    per = triton.cdiv(n_blocks, P) if n_blocks else 0
    dw_part = (torch.empty if n_rows else torch.zeros)(P, dim, dtype=torch.float32, device=o2.device)
    if n_rows:
        gated_rmsnorm_bwd_kernel[(P, nseg)](
            o2, g2, weight, dy, do, dg, dw_part, n_rows, nsub, o2.stride(0),
            0 if g2 is None else g2.stride(0), group, nseg, eps, per,
            BR=BR, BG=BG, ACT=act, NORM_FIRST=norm_first,
        )  # fmt: skip
    return do, dg, dw_part.sum(0).to(weight.dtype)
