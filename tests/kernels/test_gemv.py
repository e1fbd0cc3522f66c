"""Decode GEMV (`lt2dsl.kernels.gemv`): the Triton kernel (CPU interpreter here) against the unfused
chain in float64, on shapes that are not multiples of the tiles (K, N) and M = 1, 3, 8 rows; the
kernel's error may not exceed the unfused bf16 chain's by more than rounding."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.fused.testing import rel_rms
from lt2dsl.kernels.gemv import gemv, gemv_applies, norm_add_gemv
from lt2dsl.kernels.gemv.naive import gemv_chain_f64, gemv_ref, norm_add_gemv_chain_f64, norm_add_gemv_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
K, N = 200, 37  # one full and one partial K tile of 128; three column blocks of 16, the last partial


def _inputs(M: int, dtype: torch.dtype, rows: int = N, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * 2 + 0.5
    w = torch.randn(rows, K, generator=g) / K**0.5
    gamma = 1 + 0.3 * torch.randn(K, generator=g)
    r = torch.randn(M, N, generator=g)
    return [t.to(DEVICE, dtype) for t in (x, w, gamma, r)]


CASES = {
    "plain": lambda w, gamma, r: {},
    "rmsnorm": lambda w, gamma, r: {"norm_weight": gamma, "eps": 1e-6},
    "residual": lambda w, gamma, r: {"residual": r},
    "rmsnorm-swiglu": lambda w, gamma, r: {"norm_weight": gamma, "eps": 1e-6, "up": N + 3, "width": N},
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("case", list(CASES))
def test_gemv_matches_the_unfused_chain(case, M, dtype):
    # the SwiGLU weight is a padded gate/up concatenation: gate rows [0, N), up rows [N + 3, 2N + 3)
    x, w, gamma, r = _inputs(M, dtype, rows=2 * N + 8 if "swiglu" in case else N)
    kw = CASES[case](w, gamma, r)
    assert gemv_applies(x, w, backend="triton")
    out = gemv(x, w, backend="triton", **kw)
    truth = gemv_chain_f64(x, w, **kw)
    chain = gemv_ref(x, w, **kw)  # the unfused ops in dtype: the rounding the fusion may match
    assert out.shape == truth.shape == (M, N) and out.dtype == dtype
    err, err_chain = rel_rms(out, truth), rel_rms(chain, truth)
    assert err <= 1.5 * err_chain + 2e-3, f"{case}: fused {err:.2e} vs the unfused chain's {err_chain:.2e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_norm_add_gemv_matches_the_unfused_sandwich_chain(swiglu, M, dtype):
    # s = res + RMSNorm(y) · γ₁ and its RMSNorm · γ₂ projected: both outputs held to the f64 chain
    x, w, gamma, _ = _inputs(M, dtype, rows=2 * N + 8 if swiglu else N)
    y, res, gamma1 = x.flip(-1) * 3, x.roll(7, -1) - 1, gamma.flip(-1)  # y's scale must not matter
    args = (res, y, gamma1, 1e-5, w, gamma, 1e-6)
    kw = {"up": N + 3, "width": N} if swiglu else {}
    s, out = norm_add_gemv(*args, backend="triton", **kw)
    s_truth, truth = norm_add_gemv_chain_f64(*args, **kw)
    s_chain, chain = norm_add_gemv_ref(*args, **kw)
    assert s.shape == s_truth.shape == (M, K) and out.shape == truth.shape == (M, N) and out.dtype == dtype
    for name, got, ref, unfused in (("s", s, s_truth, s_chain), ("out", out, truth, chain)):
        err, err_chain = rel_rms(got, ref), rel_rms(unfused, ref)
        assert err <= 1.5 * err_chain + 2e-3, f"{name}: fused {err:.2e}, unfused {err_chain:.2e}"


def _gated_inputs(M: int, dtype: torch.dtype, group: int, dim: int, seed: int = 1):
    """o `[M, K]` whose groups of `group` channels have scales 1/8 … 8 apart, its gate, γ `[dim]`."""
    g = torch.Generator().manual_seed(seed)
    scale = 2.0 ** torch.randint(-3, 4, (M, K // group, 1), generator=g).float()
    o = (torch.randn(M, K // group, group, generator=g) * scale).flatten(1)
    z = torch.randn(M, K, generator=g) * 2
    gamma = 1 + 0.3 * torch.randn(dim, generator=g)
    return [t.to(DEVICE, dtype) for t in (o, z, gamma)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize(("group", "dim"), [(8, 40), (4, 200)])
def test_gated_norm_gemv_matches_the_unfused_chain(group, dim, M, dtype):
    # γ of 5 groups repeated over K (8) or one per channel (4); K = 200: the second K tile is partial
    o, z, gamma = _gated_inputs(M, dtype, group, dim)
    _, w, _, r = _inputs(M, dtype)
    kw = {"norm_weight": gamma, "eps": 1e-6, "gate": z, "group": group, "residual": r}
    out = gemv(o, w, backend="triton", **kw)
    truth, chain = gemv_chain_f64(o, w, **kw), gemv_ref(o, w, **kw)
    assert out.shape == (M, N) and out.dtype == dtype
    err, err_chain = rel_rms(out, truth), rel_rms(chain, truth)
    assert err <= 1.5 * err_chain + 2e-3, f"fused {err:.2e}, unfused {err_chain:.2e}"


def test_gated_norm_gemv_normalises_each_group_alone():
    # groups of 8 channels up to 64x apart in scale: a norm over wider or narrower groups is far off
    o, z, gamma = _gated_inputs(3, torch.bfloat16, 8, 40)
    _, w, _, _ = _inputs(3, torch.bfloat16)
    kw = {"norm_weight": gamma, "eps": 1e-6, "gate": z}
    out = gemv(o, w, group=8, backend="triton", **kw)
    truth = gemv_chain_f64(o, w, group=8, **kw)
    assert rel_rms(out, truth) < 1e-2
    for group in (4, 40):
        assert rel_rms(out, gemv_chain_f64(o, w, group=group, **kw)) > 0.1, group


def test_gemv_keeps_leading_dims_and_reads_strided_rows():
    x, w, gamma, r = _inputs(4, torch.bfloat16)
    wide = torch.zeros(2, 2, 1, K + 8, dtype=torch.bfloat16, device=DEVICE)
    wide[..., 3 : 3 + K] = x.view(2, 2, 1, K)
    xs = wide[..., 3 : 3 + K]  # rows 8 + K apart
    out = gemv(xs, w, residual=r.view(2, 2, 1, N), backend="triton")
    assert out.shape == (2, 2, 1, N)
    truth = gemv_chain_f64(x, w, residual=r).view(2, 2, 1, N)
    assert rel_rms(out, truth) < 1e-2


def test_gemv_runs_the_chain_where_the_kernel_does_not_apply():
    x, w, gamma, r = _inputs(3, torch.bfloat16)
    big = torch.randn(17, K, dtype=torch.bfloat16, device=DEVICE)
    assert not gemv_applies(big, w, backend="triton")  # more rows than one launch takes
    assert not gemv_applies(x.float(), w.float(), backend="triton")  # 32-bit
    assert not gemv_applies(x, w, backend="reference")
    wg = w.clone().requires_grad_()
    assert not gemv_applies(x, wg, backend="triton")  # autograd to record
    out = gemv(x, wg, norm_weight=gamma, backend="triton")
    assert out.requires_grad
    torch.testing.assert_close(out, gemv_ref(x, wg, norm_weight=gamma))


def test_gemv_refuses_a_bad_swiglu_split():
    x, w, gamma, r = _inputs(1, torch.bfloat16)
    with pytest.raises(ValueError, match="SwiGLU"):
        gemv(x, w, up=30, width=20, backend="triton")  # up rows past the weight's 37
    with pytest.raises(ValueError, match="SwiGLU"):
        gemv(x, w, up=10, residual=r, backend="triton")


def test_deep_configs_are_tuned_on_narrow_outputs_only():
    """The deep configs (BN 16, long K tiles, many stages) are candidates where N / 16 programs
    barely cover the SMs (MLP down, GDN o_proj: N = 2048), not on wide outputs, never with a K tile
    longer than K, and with a gated norm only up to MAX_GROUP (BK 1024 spills there)."""
    import triton

    from lt2dsl.kernels.gemv import triton_gemv as G

    general = [triton.Config({"BN": 16, "BK": 128}, num_warps=4, num_stages=4)]
    deep = [triton.Config({"BN": bn, "BK": bk}, num_warps=w, num_stages=s) for bn, bk, w, s in G.DEEP]
    configs = general + deep

    def kept(**args) -> list[int]:
        return [c.kwargs["BK"] for c in G.kept_configs(configs, args) if G.is_deep(c)]

    assert kept(PRO=0, N=2048, K=5632) == [256, 512, 1024]
    assert kept(PRO=0, N=12320, K=2048) == []
    assert kept(PRO=1, N=2048, K=512) == [256, 512]
    assert kept(PRO=3, GROUP=256, N=2048, K=4096) == [256, 512]
    assert kept(PRO=3, GROUP=512, N=2048, K=4096) == [512]
    assert all(c in G.kept_configs(configs, {"PRO": 0, "N": 12320, "K": 2048}) for c in general)
