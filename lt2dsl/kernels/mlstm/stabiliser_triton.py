"""The mLSTM backward's stabiliser path as one Triton kernel (`stabiliser.py` is its reference).

`route_and_finish` takes what the chunk kernels leave (per-K-block dlogf and dĩ, ∂L/∂m_r) and
returns the final df̃, dĩ and dm_0: the sum over K blocks, dm_T added at each sequence's last
token, the float64 routing of ∂L/∂m_r through m_r = F_r + max(m_0, max_{j≤r}(ĩ_j − F_j)) and
df̃ = (dlogf) σ(−f̃), in one program per (sequence, head). In PyTorch the same path is ~20 kernels
(three float64 scans among them: ~150 µs of a 2.9 ms mLSTM forward+backward on the H200, B=4,
T=8192, H=16). On the H200 the
kernel takes ~100 µs there: one program per (sequence, head), each walking T twice.

Per sequence: pass 1 walks the tokens forward in blocks, F by a cumulative sum carried across
blocks, the running argmax of u = ĩ − F (ties to the later index, as torch.cummax) by an
associative scan, and adds each ∂L/∂m_r to its argmax's slot of a float64 scratch row (slot 0 is
m_0) with an atomic add. Pass 2 walks backwards: dF = ∂L/∂m − routed, dlogf its suffix sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.backend import triton_interpreting
from ..decay.chunks import seq_start


@triton.jit
def _argmax_later(v1, i1, v2, i2):
    """Running argmax with ties to the later index (associative)."""
    take = v2 >= v1
    return tl.where(take, v2, v1), tl.where(take, i2, i1)


@triton.jit
def _last(x, o, BL: tl.constexpr):
    """x[BL − 1] of a `[BL]` vector (a masked reduction: Triton has no scalar indexing)."""
    return tl.sum(tl.where(o == BL - 1, x, 0), axis=0)


@triton.jit(do_not_specialize=["T", "NTOT"])
def route_kernel(
    f, ig, dm, dm_T, m0, dlf_k, di_k, R, df, di, dm0, cu_seqlens, T, NTOT,
    H: tl.constexpr, NK: tl.constexpr, BL: tl.constexpr,
    HAS_M0: tl.constexpr, HAS_DMT: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """One (sequence, head). f, ig, dm `[B·T, H]` fp32; dlf_k, di_k `[NK, B·T, H]`; R float64 zeros
    `[H, B·T + N]` (sequence n of head h owns L_n + 1 slots from bos_n + n); df, di like f;
    dm0 `[N, H]`."""
    i_nh = tl.program_id(0)
    i_n, i_h = i_nh // H, i_nh % H
    bos, L = seq_start(i_n, cu_seqlens, T, IS_VARLEN)
    r_base = R + i_h.to(tl.int64) * (NTOT + tl.num_programs(0) // H) + bos + i_n
    o_l = tl.arange(0, BL)
    d_T = 0.0
    if HAS_DMT:
        d_T = tl.load(dm_T + i_nh).to(tl.float64)
    c_F = tl.sum(tl.zeros([1], dtype=tl.float64), axis=0)
    c_M = c_F
    if HAS_M0:
        c_M += tl.load(m0 + i_nh).to(tl.float64)
    c_I = tl.sum(tl.zeros([1], dtype=tl.int32), axis=0) - 1
    for t0 in range(0, L, BL):
        o = t0 + o_l
        valid = o < L
        p = (bos + o) * H + i_h
        x = tl.load(f + p, mask=valid, other=0.0).to(tl.float64)
        lf = tl.where(valid, tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x))), 0.0)
        F = c_F + tl.cumsum(lf, axis=0)
        u = tl.where(valid, tl.load(ig + p, mask=valid, other=0.0).to(tl.float64) - F, float("-inf"))
        mv, mi = tl.associative_scan((u, o), 0, _argmax_later)
        idx = tl.where(mv >= c_M, mi, c_I)
        d = tl.load(dm + p, mask=valid, other=0.0).to(tl.float64)
        d += tl.where(o == L - 1, d_T, 0.0)
        tl.atomic_add(r_base + idx + 1, d, mask=valid)
        c_F += tl.sum(lf, axis=0)
        b_M, b_I = _last(mv, o_l, BL), _last(mi, o_l, BL)
        c_I = tl.where(b_M >= c_M, b_I, c_I)
        c_M = tl.maximum(b_M, c_M)
    tl.debug_barrier()
    c_S = tl.sum(tl.zeros([1], dtype=tl.float64), axis=0)
    n_blk = tl.cdiv(L, BL)
    for jb in range(n_blk):
        o = (n_blk - 1 - jb) * BL + o_l
        valid = o < L
        p = (bos + o) * H + i_h
        # past L1: the routed sums arrived by atomics in L2
        routed = tl.load(r_base + o + 1, mask=valid, other=0.0, cache_modifier=".cg")
        d = tl.load(dm + p, mask=valid, other=0.0).to(tl.float64)
        d += tl.where(o == L - 1, d_T, 0.0)
        dF = tl.where(valid, d - routed, 0.0)
        dlogf = tl.cumsum(dF, axis=0, reverse=True) + c_S
        c_S += tl.sum(dF, axis=0)
        b_dlf = tl.zeros([BL], dtype=tl.float64)
        b_di = routed
        for k in range(NK):
            b_dlf += tl.load(dlf_k + k * NTOT * H + p, mask=valid, other=0.0).to(tl.float64)
            b_di += tl.load(di_k + k * NTOT * H + p, mask=valid, other=0.0).to(tl.float64)
        x = tl.load(f + p, mask=valid, other=0.0).to(tl.float64)
        sig = 1.0 / (1.0 + tl.exp(x))
        tl.store(df + p, ((b_dlf + dlogf) * sig).to(tl.float32), mask=valid)
        tl.store(di + p, b_di.to(tl.float32), mask=valid)
    tl.store(dm0 + i_nh, tl.load(r_base, cache_modifier=".cg").to(tl.float32))


def route_and_finish(f, ig, dm, dm_T, m0, dlf_k, di_k, cu_seqlens, *, block=None, num_warps=None):
    """(df̃ `[B, T, H]`, dĩ `[B, T, H]`, dm_0 `[N, H]`) fp32 from the chunk kernels' outputs.

    f: the forget-gate pre-activations `[B, T, H]`; ig: ĩ fp32; dm: ∂L/∂m_r fp32; dm_T `[N, H]` or
    None (added at every sequence's last token); m0 `[N, H]` or None (then 0); dlf_k, di_k
    `[NK, B, T, H]` fp32 per-K-block parts. `block` (tokens per step) and `num_warps` override the
    defaults, 2048 tokens and 16 warps: one program per (sequence, head) leaves most of the GPU
    idle, so each program is made wide (H200, B=4, T=8192, H=16: 167 µs at 1024 tokens and 4
    warps, 100 µs at 2048 and 16; `bench/mlstm_route.py`).
    """
    B, T, H = f.shape
    NK = dlf_k.shape[0]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    f32 = [x.float().contiguous() for x in (f, ig, dm)]
    R = torch.zeros(H, B * T + N, dtype=torch.float64, device=f.device)
    df, di = (torch.empty(B, T, H, dtype=torch.float32, device=f.device) for _ in range(2))
    dm0 = torch.empty(N, H, dtype=torch.float32, device=f.device)
    dummy = f32[0]
    route_kernel[(N * H,)](
        *f32,
        dummy if dm_T is None else dm_T.float().contiguous(),
        dummy if m0 is None else m0.float().contiguous(),
        dlf_k.contiguous(), di_k.contiguous(), R, df, di, dm0,
        cu_seqlens, T, B * T,
        H=H, NK=NK, BL=block or (16 if triton_interpreting() else 2048),
        num_warps=num_warps or (1 if triton_interpreting() else 16),
        HAS_M0=m0 is not None, HAS_DMT=dm_T is not None, IS_VARLEN=cu_seqlens is not None,
    )  # fmt: skip
    return df, di, dm0
