"""`mlstm` against its float64 stabilised recurrence, plus the stabiliser-invariance of §8."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lt2dsl.kernels.mlstm import chunk_mlstm_ref, mlstm, naive_recurrent_mlstm
from tests.kernels.utils import assert_close

F64 = torch.float64


def make_inputs(B, T, H, K, V, dtype=F64, seed=0, gates="xlstm", device="cpu"):
    """q, k `[B, T, H, K]`, v `[B, T, H, V]`, i, f `[B, T, H]` (fp32 unless float64)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=gen, dtype=F64)

    q, k, v = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, H, V)
    if gates == "xlstm":  # f̃ bias in [3, 6], ĩ ~ N(0, 1)
        i, f = rnd(B, T, H), rnd(B, T, H) + 4
    elif gates == "wide":  # large input gates (soft-cap range ±15) and fast forgetting
        i, f = 15 * torch.tanh(3 * rnd(B, T, H) / 15), 2 * rnd(B, T, H)
    else:
        i, f = rnd(B, T, H), rnd(B, T, H)
    cast = [x.to(dtype).to(device) for x in (q, k, v)]
    gd = F64 if dtype == F64 else torch.float32
    return (*cast, i.to(gd).to(device), f.to(gd).to(device))


def make_state(B, H, K, V, seed=1):
    gen = torch.Generator().manual_seed(seed)
    C = torch.randn(B, H, K, V, generator=gen, dtype=F64)
    n = torch.randn(B, H, K, generator=gen, dtype=F64)
    return C, n, torch.randn(B, H, generator=gen, dtype=F64)


@pytest.mark.parametrize("T", [1, 63, 100])
@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("gates", ["xlstm", "wide", "plain"])
def test_chunk_equals_recurrence(T, chunk, gates):
    q, k, v, i, f = make_inputs(2, T, 2, 16, 8, gates=gates, seed=T)
    s0 = make_state(2, 2, 16, 8)
    h_ref, s_ref = naive_recurrent_mlstm(q, k, v, i, f, 0.25, 1e-6, s0)
    h, s = chunk_mlstm_ref(q, k, v, i, f, 0.25, 1e-6, s0, chunk_size=chunk)
    assert_close("h", h, h_ref, 1e-10)
    for name, a, b in zip("Cnm", s, s_ref):
        assert_close(name, a, b, 1e-10)


def _unstabilised(q, k, v, i, f, scale):
    """h_t = Ĉ_tᵀq_t / max(|n̂_tᵀq_t|, 1) with Ĉ_t = Σ_j Π σ(f̃) e^{ĩ_j} k_j v_jᵀ (mixers.md §8(b))."""
    logf = F.logsigmoid(f)
    Fc = logf.cumsum(1)  # [B, T, H]
    T = q.shape[1]
    w = (Fc[:, :, None] - Fc[:, None, :] + i[:, None, :]).exp()  # [B, t, j, H]
    w = w * torch.ones(T, T, dtype=q.dtype).tril()[None, :, :, None]
    s = torch.einsum("bthk,bjhk->btjh", q * scale, k) * w
    num = torch.einsum("btjh,bjhv->bthv", s, v)
    return num / s.sum(2).abs().clamp(min=1)[..., None]


@pytest.mark.parametrize("chunk", [16, 64])
def test_output_independent_of_stabiliser(chunk):
    """ε = 0: the stabilised chunked form equals the unstabilised formula (§8 invariant), and an
    initial state given with a shifted stabiliser (C e^{−δ}, n e^{−δ}, m + δ) gives the same output."""
    q, k, v, i, f = make_inputs(1, 70, 2, 8, 4, gates="plain")
    h, _ = chunk_mlstm_ref(q, k, v, i, f, 0.3, 0.0, None, chunk_size=chunk)
    assert_close("h vs unstabilised", h, _unstabilised(q, k, v, i, f, 0.3), 1e-10)
    C, n, m = make_state(1, 2, 8, 4)
    h1, _ = mlstm(q, k, v, i, f, scale=0.3, eps=0.0, initial_state=(C, n, m))
    delta = torch.tensor([[3.0, -2.0]], dtype=F64)
    shifted = (C * (-delta).exp()[..., None, None], n * (-delta).exp()[..., None], m + delta)
    h2, _ = mlstm(q, k, v, i, f, scale=0.3, eps=0.0, initial_state=shifted)
    assert_close("h with shifted stabiliser", h2, h1, 1e-10)


def test_gradcheck_reference_with_large_eps():
    """eps = 0.5 makes the stabiliser path (m inside ε e^{m}) carry real gradient."""
    q, k, v, i, f = make_inputs(1, 7, 1, 3, 2, seed=3, gates="wide")
    s0 = tuple(x.requires_grad_() for x in make_state(1, 1, 3, 2))
    leaves = [x.requires_grad_() for x in (q, k, v, i, f)]

    def fn(q, k, v, i, f, C, n, m):
        h, st = mlstm(q, k, v, i, f, eps=0.5, initial_state=(C, n, m), output_final_state=True)
        return h, *st

    assert torch.autograd.gradcheck(fn, [*leaves, *s0], fast_mode=True)


def test_gradcheck_chunked_across_chunks():
    q, k, v, i, f = make_inputs(1, 11, 1, 2, 2, seed=4, gates="wide")
    leaves = [x.requires_grad_() for x in (q, k, v, i, f)]
    assert torch.autograd.gradcheck(
        lambda *a: chunk_mlstm_ref(*a, 0.7, 0.1, None, chunk_size=4)[0], leaves, fast_mode=True
    )


def test_decode_after_prefill_equals_one_shot():
    q, k, v, i, f = make_inputs(2, 40, 2, 8, 4, gates="wide")
    h_all, s_all = mlstm(q, k, v, i, f, output_final_state=True)
    h1, s1 = mlstm(q[:, :35], k[:, :35], v[:, :35], i[:, :35], f[:, :35], output_final_state=True)
    state, outs = tuple(x.clone() for x in s1), []
    for t in range(35, 40):
        sl = slice(t, t + 1)
        h_t, ret = mlstm(
            q[:, sl], k[:, sl], v[:, sl], i[:, sl], f[:, sl], initial_state=state, inplace_final_state=True
        )
        assert all(a is b for a, b in zip(ret, state))
        outs.append(h_t)
    assert_close("h", torch.cat([h1, *outs], 1), h_all, 1e-12)
    for name, a, b in zip("Cnm", state, s_all):
        assert_close(name, a, b, 1e-12)


def test_cu_seqlens_equals_separate_runs():
    lens = [5, 37, 1, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    q, k, v, i, f = make_inputs(1, sum(lens), 2, 8, 4, gates="wide")
    s0 = make_state(len(lens), 2, 8, 4)
    h, s = mlstm(q, k, v, i, f, initial_state=s0, output_final_state=True, cu_seqlens=cu)
    for n in range(len(lens)):
        a, b = cu[n].item(), cu[n + 1].item()
        sl = slice(a, b)
        h_n, s_n = naive_recurrent_mlstm(
            q[:, sl], k[:, sl], v[:, sl], i[:, sl], f[:, sl], 8**-0.5, 1e-6, tuple(x[n : n + 1] for x in s0)
        )
        assert_close(f"h[{n}]", h[:, sl], h_n, 1e-10)
        for name, x, y in zip("Cnm", s, s_n):
            assert_close(f"{name}[{n}]", x[n : n + 1], y, 1e-10)


def test_shape_errors():
    q, k, v, i, f = make_inputs(1, 8, 2, 8, 4)
    with pytest.raises(ValueError, match=r"\[B, T, H\]"):
        mlstm(q, k, v, i[..., :1], f)
    with pytest.raises(ValueError, match=r"HV"):
        mlstm(q, k, torch.cat([v, v], 2), i, f)
    with pytest.raises(ValueError, match=r"\[N, H, K\]"):
        C, n, m = make_state(1, 2, 8, 4)
        mlstm(q, k, v, i, f, initial_state=(C, n[..., :3], m))
    with pytest.raises(ValueError, match="tuple"):
        mlstm(q, k, v, i, f, initial_state=torch.zeros(1, 2, 8, 4))
