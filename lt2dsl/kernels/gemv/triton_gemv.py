"""Triton kernel of the decode GEMV: `y[M, N] = f(x)[M, K] @ W[N, K]ᵀ` for a decode batch M ≤ 16.

At decode every projection reads its whole weight for a handful of rows, so it is bound by the
weight's bytes; the kernel streams W once, one block of BN output columns per program (all SMs
read W at once), and does the cheap work around the product in the same pass:

* prologue `PRO`: 0 none; 1 RMSNorm(x) · γ over K. The sum of squares of each row is gathered in
  the same loop as the product (x is `[M, K]`, a few KB, read from L2 by every program), the
  product takes bf16(x · γ) and the rows are scaled by rstd at the end: RMSNorm is a per-row
  scale, so this equals the product of the normed rows up to bf16 rounding. 2 a sandwich block's
  residual add-norm: the input read is s = res + RMSNorm(x) · γ₁ (a first pass over x gathers its
  rows' rstd₁; the branch norm and the sum rounded to the dtype as the unfused norm-add's are),
  then RMSNorm(s) · γ as in 1; program 0 also writes s (the residual stream). 3 fla's gated
  RMSNorm (GDN's output norm): RMSNorm over each group of GROUP channels, · γ[k mod len(γ)],
  · silu(gate) (gate `[M, K]` read like x), rounded to the dtype as the unfused norm's output; a K
  tile holds whole groups (BK a multiple of GROUP, the pruner drops the other configs), so each
  group's rstd is formed from the tile alone.
* epilogue `EPI`: 0 none; 1 SwiGLU: the program also owns the matching columns `up + n` of the
  up half of a concatenated gate/up weight and writes silu(g) · u (g, u rounded to the output
  dtype first, as the GEMM's outputs are); 2 residual add: writes r + y (y rounded first, as the
  unfused `h + proj(x)` is).

The product is `tl.dot(W tile [BN, BK], xᵀ tile [BK, BM])` with BM = 16 (rows past M masked to
zero): W is read in its own K-contiguous layout, accumulation in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lt2dsl.kernels.common.backend import triton_interpreting
from lt2dsl.kernels.common.tl_util import INTERP, cast, helper

BM = 16  # tl.dot's smallest tile: the decode rows, padded
MAX_M = BM
PRO_CODES = {None: 0, "rmsnorm": 1, "norm-add-rmsnorm": 2, "gated-rmsnorm": 3}
MAX_BK = 256  # the general configs' largest K tile without a gated norm (narrow outputs: `DEEP` too)
MAX_GROUP = 512  # the largest group of a gated norm: it must divide a config's BK
EPI_CODES = {None: 0, "swiglu": 1, "residual": 2}
# Outputs of at most this many columns are narrow: N / 16 programs (BN is tl.dot's 16 at least)
# leave at most ~2 a card's SMs (132 on the H100), so each program must keep many bytes of W in
# flight: the deep configs (BN 16, 3-6 stages of 16-64 KB tiles) are theirs.
# The H100 profile of the hybrid's decode step ran cuBLAS at 1.7-2.0 TB/s on exactly these shapes
# (MLP down and GDN o_proj, N = 2048; bench/results/2026-12-06_s27_*).
NARROW_N = 4096
DEEP = ((16, 256, 4, 6), (16, 512, 8, 4), (16, 1024, 8, 3))


def gemv_configs() -> list:
    """Autotune candidates (BN, BK, warps, stages): the general ones, two BK 512 for the gated norm's
    widest groups, then the deep ones of narrow outputs (`DEEP`). Under the CPU interpreter one of
    each BK (`prune_configs` picks one)."""
    out = [
        triton.Config({"BN": bn, "BK": bk}, num_warps=w, num_stages=s)
        for bn, bk, w, s in (
            (16, 128, 4, 4), (16, 256, 4, 3), (16, 512, 4, 2), (32, 128, 4, 4),
            (32, 256, 8, 3), (64, 128, 8, 3), (64, 64, 4, 4), (32, 512, 8, 2), *DEEP,
        )
    ]  # fmt: skip
    return out[:3] if triton_interpreting() else out


def is_deep(config) -> bool:
    k = config.kwargs
    return (k["BN"], k["BK"], config.num_warps, config.num_stages) in DEEP


def kept_configs(configs: list, args: dict) -> list:
    """The configs whose K tile holds whole groups of the gated norm, those of BK ≤ MAX_BK for the
    other forms; the deep ones only where the output is narrow (N ≤ NARROW_N) and BK ≤ K (with a
    gated norm BK ≤ MAX_GROUP too: its BK 1024 build spills at 255 registers)."""
    gated, group = args["PRO"] == 3, args.get("GROUP", 1)
    narrow, K = args["N"] <= NARROW_N, args["K"]

    def keep(c) -> bool:
        BK = c.kwargs["BK"]
        if is_deep(c):
            fits = BK % group == 0 and BK <= MAX_GROUP if gated else True
            return narrow and fits and BK <= K
        return BK % group == 0 if gated else BK <= MAX_BK

    return [c for c in configs if keep(c)]


def prune_configs(configs: list, named_args: dict, **kwargs) -> list:
    """`kept_configs`; under the interpreter the first of them only."""
    kept = kept_configs(configs, {**named_args, **kwargs})
    return kept[:1] if triton_interpreting() else kept


@helper
def _dot(a, b):
    """a @ b in fp32; the interpreter's 16-bit `tl.dot` returns garbage, so it takes fp32 operands."""
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.autotune(
    gemv_configs(),
    key=["N", "K", "M", "PRO", "EPI", "GROUP"],
    prune_configs_by={"early_config_prune": prune_configs},
)
@triton.jit
def gemv_kernel(
    x, w, y, r, nw, xr, nw1, s, M, N, K, sx, sw, sy, sr, sxr, ss_, up, nwd, eps, eps1,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRO: tl.constexpr, EPI: tl.constexpr,
    GROUP: tl.constexpr = 1,
):  # fmt: skip
    pid = tl.program_id(0)
    rn = pid.to(tl.int64) * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    m_n, m_m = rn < N, rm < M
    DT = y.dtype.element_ty
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    acc_u = tl.zeros([BN, BM], dtype=tl.float32)
    ss = tl.zeros([BM], dtype=tl.float32)
    if PRO == 2:
        ss1 = tl.zeros([BM], dtype=tl.float32)
        for k0 in range(0, K, BK):
            rk = k0 + tl.arange(0, BK)
            m_xk = (rk < K)[:, None] & m_m[None, :]
            b_y = tl.load(x + rm[None, :] * sx + rk[:, None], mask=m_xk, other=0.0).to(tl.float32)
            ss1 += tl.sum(b_y * b_y, axis=0)
        rstd1 = 1.0 / tl.sqrt(ss1 / K + eps1)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        m_k = rk < K
        m_xk = m_k[:, None] & m_m[None, :]
        b_x = tl.load(x + rm[None, :] * sx + rk[:, None], mask=m_xk, other=0.0)
        if PRO == 2:
            b_g1 = tl.load(nw1 + rk, mask=m_k, other=0.0).to(tl.float32)
            b_n1 = cast(b_x.to(tl.float32) * rstd1[None, :] * b_g1[:, None], DT).to(tl.float32)
            b_res = tl.load(xr + rm[None, :] * sxr + rk[:, None], mask=m_xk, other=0.0).to(tl.float32)
            b_x = cast(b_res + b_n1, DT)
            tl.store(s + rm[None, :] * ss_ + rk[:, None], b_x, mask=m_xk & (rm * 0 + pid == 0)[None, :])
        if PRO == 3:
            b_o = tl.reshape(b_x.to(tl.float32), [BK // GROUP, GROUP, BM])
            b_rstd = 1.0 / tl.sqrt(tl.sum(b_o * b_o, axis=1) / GROUP + eps)
            b_o = tl.reshape(b_o * b_rstd[:, None, :], [BK, BM])
            b_gw = tl.load(nw + rk % nwd, mask=m_k, other=0.0).to(tl.float32)
            b_z = tl.load(xr + rm[None, :] * sxr + rk[:, None], mask=m_xk, other=0.0).to(tl.float32)
            b_x = cast(b_o * b_gw[:, None] * (b_z * tl.sigmoid(b_z)), DT)
        if PRO == 1 or PRO == 2:
            b_xf = b_x.to(tl.float32)
            ss += tl.sum(b_xf * b_xf, axis=0)
            b_g = tl.load(nw + rk, mask=m_k, other=0.0).to(tl.float32)
            b_x = b_xf * b_g[:, None]
        b_x = cast(b_x, w.dtype.element_ty)
        m_w = m_n[:, None] & m_k[None, :]
        b_w = tl.load(w + rn[:, None] * sw + rk[None, :], mask=m_w, other=0.0)
        acc += _dot(b_w, b_x)
        if EPI == 1:
            b_u = tl.load(w + (rn[:, None] + up) * sw + rk[None, :], mask=m_w, other=0.0)
            acc_u += _dot(b_u, b_x)
    if PRO == 1 or PRO == 2:
        rstd = 1.0 / tl.sqrt(ss / K + eps)
        acc = acc * rstd[None, :]
        acc_u = acc_u * rstd[None, :]
    out = cast(acc, DT).to(tl.float32)
    m_y = m_n[:, None] & m_m[None, :]
    if EPI == 1:
        # silu(g) rounded as the unfused `F.silu(g)` output is, then the product with u
        b_silu = cast(out * tl.sigmoid(out), DT).to(tl.float32)
        out = b_silu * cast(acc_u, DT).to(tl.float32)
    if EPI == 2:
        out += tl.load(r + rm[None, :] * sr + rn[:, None], mask=m_y, other=0.0).to(tl.float32)
    tl.store(y + rm[None, :] * sy + rn[:, None], cast(out, DT), mask=m_y)


def gemv_fwd(
    x2: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    up: int | None = None,
    sandwich: tuple[torch.Tensor, torch.Tensor, float, torch.Tensor] | None = None,
    gated: tuple[torch.Tensor, int] | None = None,
) -> torch.Tensor:
    """Launch the kernel: x2 `[M, K]` (unit column stride), weight `[N_w, K]` (unit column stride),
    out `[M, N]` written (N = the gate half's width with `up`), residual `[M, N]` or None.
    `norm_weight` turns the RMSNorm prologue on; `up` the SwiGLU epilogue (the up rows' offset);
    `sandwich` = (res `[M, K]`, γ₁ `[K]`, ε₁, s `[M, K]` written) the norm-add before it (x2 is then
    the branch output RMSNorm₁ reads); `gated` = (gate `[M, K]`, group) makes the norm fla's gated
    one over groups of `group` channels (a power of two ≤ MAX_GROUP; norm_weight `[dim]`, dim a
    multiple of group dividing K)."""
    M, K = x2.shape
    N = out.shape[1]
    pro = PRO_CODES[None if norm_weight is None else "rmsnorm" if sandwich is None else "norm-add-rmsnorm"]
    epi = EPI_CODES["swiglu" if up is not None else "residual" if residual is not None else None]
    r = residual if residual is not None else out
    nw = norm_weight if norm_weight is not None else weight
    xr, nw1, eps1, s = sandwich if sandwich is not None else (x2, nw, 0.0, x2)
    group = 1
    if gated is not None:
        pro, (xr, group) = PRO_CODES["gated-rmsnorm"], gated

    def grid(meta):
        return (triton.cdiv(N, meta["BN"]),)

    gemv_kernel[grid](
        x2, weight, out, r, nw, xr, nw1, s, M, N, K, x2.stride(0), weight.stride(0), out.stride(0),
        r.stride(0), xr.stride(0), s.stride(0), up or 0, nw.shape[0], float(eps), float(eps1),
        BM=BM, PRO=pro, EPI=epi, GROUP=group,
    )  # fmt: skip
    return out
