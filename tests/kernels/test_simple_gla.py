"""`simple_gla` against its float64 recurrence: chunked form, gradients, states, GVA, varlen, regimes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lt2dsl.kernels.simple_gla import chunk_simple_gla_ref, naive_recurrent_simple_gla, simple_gla
from tests.kernels.test_decay_common import DEVICE, TOL, run_fwd_bwd
from tests.kernels.utils import assert_close

F64 = torch.float64
# Triton launchers allocate NaN-filled buffers in every test of this file
pytestmark = pytest.mark.usefixtures("poison")


def make_inputs(B, T, H, HV, K, V, dtype=F64, decay="mixed", seed=0, device="cpu"):
    """q, k `[B, T, H, K]`, v `[B, T, HV, V]`, g `[B, T, HV]` (None for decay="none")."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=gen, dtype=F64)

    q, k, v = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, HV, V)
    if decay == "none":
        g = None
    elif decay == "retnet":  # γ_h = 1 − 2^{−5−h}, close to 1
        gam = 1 - 2.0 ** (-5 - torch.arange(HV, dtype=F64))
        g = gam.log().expand(B, T, HV).clone()
    elif decay == "strong":  # Mamba2-like dt·A: far from 1
        g = -F.softplus(rnd(B, T, HV)) * 4
    else:
        g = F.logsigmoid(rnd(B, T, HV) + 2)
    cast = [x.to(dtype).to(device) for x in (q, k, v)]
    return (*cast, None if g is None else g.float().to(device) if dtype != F64 else g.to(device))


@pytest.mark.parametrize("T", [1, 63, 100])
@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("decay", ["mixed", "retnet", "strong", "none"])
def test_chunk_equals_recurrence(T, chunk, decay):
    q, k, v, g = make_inputs(2, T, 2, 4, 16, 8, decay=decay, seed=T)
    h0 = torch.randn(2, 4, 16, 8, dtype=F64)
    o_ref, s_ref = naive_recurrent_simple_gla(q, k, v, g, 0.25, h0)
    o, s = chunk_simple_gla_ref(q, k, v, g, 0.25, h0, chunk_size=chunk)
    assert_close("o", o, o_ref, 1e-10)
    assert_close("final_state", s, s_ref, 1e-10)


def test_padding_tail_leaves_state_unchanged():
    """Zero-padded tail tokens (k = 0, v = 0, log decay 0) change neither outputs nor the final state."""
    q, k, v, g = make_inputs(1, 50, 2, 2, 8, 8)
    o, s = chunk_simple_gla_ref(q, k, v, g, 0.5, None, chunk_size=16)
    pad = (0, 0, 0, 0, 0, 14)
    o2, s2 = chunk_simple_gla_ref(
        F.pad(q, pad), F.pad(k, pad), F.pad(v, pad), F.pad(g, (0, 0, 0, 14)), 0.5, None, chunk_size=16
    )
    assert_close("o", o2[:, :50], o, 1e-12)
    assert_close("state", s2, s, 1e-12)


def test_gradcheck_reference():
    q, k, v, g = make_inputs(1, 7, 1, 2, 3, 2, seed=3)
    h0 = torch.randn(1, 2, 3, 2, dtype=F64)
    leaves = [x.requires_grad_() for x in (q, k, v, g, h0)]

    def f(q, k, v, g, h0):
        o, s = simple_gla(q, k, v, g, initial_state=h0, output_final_state=True, backend="reference")
        return o, s

    assert torch.autograd.gradcheck(f, leaves, fast_mode=True)


def test_gradcheck_chunked_across_chunks():
    q, k, v, g = make_inputs(1, 11, 1, 1, 3, 2, seed=4)
    leaves = [x.requires_grad_() for x in (q, k, v, g)]
    assert torch.autograd.gradcheck(
        lambda *a: chunk_simple_gla_ref(*a, 0.7, None, chunk_size=4), leaves, fast_mode=True
    )


def test_final_state_and_initial_state_semantics():
    """Prefill of L tokens then decode of the rest equals one-shot prefill (state carry)."""
    q, k, v, g = make_inputs(2, 40, 2, 2, 8, 4)
    o_all, s_all = simple_gla(q, k, v, g, output_final_state=True)
    o1, s1 = simple_gla(q[:, :33], k[:, :33], v[:, :33], g[:, :33], output_final_state=True)
    assert simple_gla(q, k, v, g)[1] is None
    state = s1.clone()
    outs = []
    for t in range(33, 40):
        sl = slice(t, t + 1)
        o_t, ret = simple_gla(
            q[:, sl], k[:, sl], v[:, sl], g[:, sl], initial_state=state, inplace_final_state=True
        )
        assert ret is state  # written in place, the same tensor returned
        outs.append(o_t)
    assert_close("o", torch.cat([o1, *outs], 1), o_all, 1e-12)
    assert_close("state", state, s_all, 1e-12)


def test_gva_equals_repeated_heads():
    q, k, v, g = make_inputs(1, 30, 2, 6, 8, 4)
    o, s = simple_gla(q, k, v, g, output_final_state=True)
    o2, s2 = simple_gla(q.repeat_interleave(3, 2), k.repeat_interleave(3, 2), v, g, output_final_state=True)
    assert_close("o", o, o2, 1e-12)
    assert_close("state", s, s2, 1e-12)


def test_cu_seqlens_equals_separate_runs():
    lens = [5, 37, 1, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    q, k, v, g = make_inputs(1, sum(lens), 2, 4, 8, 4)
    h0 = torch.randn(len(lens), 4, 8, 4, dtype=F64)
    o, s = simple_gla(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    for n in range(len(lens)):
        a, b = cu[n].item(), cu[n + 1].item()
        o_n, s_n = naive_recurrent_simple_gla(
            q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], 8**-0.5, h0[n : n + 1]
        )
        assert_close(f"o[{n}]", o[:, a:b], o_n, 1e-10)
        assert_close(f"state[{n}]", s[n : n + 1], s_n, 1e-10)


def test_linear_attention_normaliser():
    """g = None with a ones column appended to v gives mixers.md §1(b)'s normalised output."""
    q, k, v, _ = make_inputs(2, 50, 2, 2, 8, 4, decay="none")
    qf, kf = F.elu(q) + 1, F.elu(k) + 1
    o, _ = simple_gla(qf, kf, torch.cat([v, torch.ones_like(v[..., :1])], -1), None, scale=1.0)
    eps = 1e-6
    normed = o[..., :-1] / (o[..., -1:] + eps)
    scores = torch.einsum("bthk,bshk->bhts", qf, kf).tril()
    ref = torch.einsum("bhts,bshv->bthv", scores, v) / (scores.sum(-1).transpose(1, 2)[..., None] + eps)
    assert_close("normalised o", normed, ref, 1e-10)


def test_mamba2_ssd_mapping():
    """q = C, k = B, v = dt·x, g = dt·A with G groups and H heads equals the SSD recurrence."""
    Bsz, T, G, H, N, P = 2, 45, 1, 4, 8, 6
    gen = torch.Generator().manual_seed(7)
    Cm, Bm = (
        torch.randn(Bsz, T, G, N, generator=gen, dtype=F64),
        torch.randn(Bsz, T, G, N, generator=gen, dtype=F64),
    )
    x = torch.randn(Bsz, T, H, P, generator=gen, dtype=F64)
    dt = F.softplus(torch.randn(Bsz, T, H, generator=gen, dtype=F64))
    A = -torch.empty(H, dtype=F64).uniform_(1, 16, generator=gen)
    y, _ = simple_gla(Cm, Bm, dt[..., None] * x, dt * A, scale=1.0)
    h = torch.zeros(Bsz, H, P, N, dtype=F64)
    ref = torch.empty(Bsz, T, H, P, dtype=F64)
    for t in range(T):
        Bt, Ct = Bm[:, t].repeat_interleave(H // G, 1), Cm[:, t].repeat_interleave(H // G, 1)
        h = (dt[:, t] * A).exp()[..., None, None] * h + (dt[:, t, :, None] * x[:, t])[..., None] * Bt[
            :, :, None
        ]
        ref[:, t] = torch.einsum("bhpn,bhn->bhp", h, Ct)
    assert_close("ssd y", y, ref, 1e-10)


def test_retnet_regime_parallel_form():
    """RetNet: O = ((QKᵀ) ⊙ D_γ) V with D_γ[n, m] = γ^{n−m} (mixers.md §2(b))."""
    q, k, v, g = make_inputs(1, 70, 3, 3, 8, 4, decay="retnet")
    o, _ = simple_gla(q, k, v, g, scale=1.0)
    n = torch.arange(70, dtype=F64)
    gam = g[0, 0].exp()  # [H]
    D = torch.where(n[:, None] >= n[None, :], gam[:, None, None] ** (n[:, None] - n[None, :]), 0.0)
    ref = torch.einsum("bthk,bshk,hts,bshv->bthv", q, k, D, v)
    assert_close("retention", o, ref, 1e-10)


def test_shape_errors():
    q, k, v, g = make_inputs(1, 8, 2, 4, 8, 4)
    with pytest.raises(ValueError, match=r"\[B, T, HV\]"):
        simple_gla(q, k, v, g[..., :2])
    with pytest.raises(ValueError, match=r"\[B, T, H, K\]"):
        simple_gla(q, k[..., :4], v, g)
    with pytest.raises(ValueError, match="multiple"):
        simple_gla(q, k, v[:, :, :3], g[..., :3])
    with pytest.raises(ValueError, match=r"\[N, HV, K, V\]"):
        simple_gla(q, k, v, g, initial_state=torch.zeros(1, 4, 8, 5))
    with pytest.raises(ValueError, match="inplace_final_state"):
        simple_gla(q, k, v, g, inplace_final_state=True)
    with pytest.raises(ValueError, match="B == 1"):
        simple_gla(
            torch.cat([q, q]),
            torch.cat([k, k]),
            torch.cat([v, v]),
            torch.cat([g, g]),
            cu_seqlens=torch.tensor([0, 8]),
        )
    with pytest.raises(ValueError, match="backend"):
        simple_gla(q, k, v, g, backend="cuda")


def test_output_dtype_follows_v():
    q, k, v, g = make_inputs(1, 9, 1, 1, 8, 4, dtype=torch.bfloat16)
    o, s = simple_gla(q, k, v, g, output_final_state=True)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert math.isfinite(o.float().sum().item())


# ---------------------------------------------------------------------------------------------
# backend="triton" (CPU: Triton interpreter at small shapes; GPU: the same checks at full size)


def check_against_float64(q, k, v, g, h0, cu_seqlens=None, tol=1e-4, scale=None):
    """Triton forward + backward versus float64 (recurrence on CPU, chunked float64 form on GPU)."""
    gen = torch.Generator().manual_seed(11)
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    do = torch.randn(*v.shape, generator=gen, dtype=F64).to(v.device)
    dht = torch.randn(N, v.shape[2], q.shape[3], v.shape[3], generator=gen, dtype=F64).to(v.device)

    def tri(q, k, v, g, h0):
        return simple_gla(q, k, v, g, scale=scale, initial_state=h0, output_final_state=True,
                          cu_seqlens=cu_seqlens, backend="triton")  # fmt: skip

    def ref(q, k, v, g, h0):
        if v.is_cuda:
            return simple_gla(q, k, v, g, scale=scale, initial_state=h0, output_final_state=True,
                              cu_seqlens=cu_seqlens, backend="reference")  # fmt: skip
        if cu_seqlens is not None:
            return simple_gla(q, k, v, g, scale=scale, initial_state=h0, output_final_state=True,
                              cu_seqlens=cu_seqlens)  # fmt: skip
        return naive_recurrent_simple_gla(q, k, v, g, scale, h0)

    o, s, grads = run_fwd_bwd(tri, [q, k, v, g, h0], do, dht)
    o64, s64, grads64 = run_fwd_bwd(
        ref, [None if x is None else x.double() for x in (q, k, v, g, h0)], do, dht
    )
    assert o.dtype == v.dtype and s.dtype == torch.float32
    assert_close("o", o, o64, tol)
    assert_close("final_state", s, s64, tol)
    for name, a, b in zip(["dq", "dk", "dv", "dg", "dh0"], grads, grads64):
        if a is not None:
            assert_close(name, a, b, tol)


def _inputs(B, T, H, HV, K, V, dtype, decay, device=DEVICE, seed=0):
    q, k, v, g = make_inputs(B, T, H, HV, K, V, decay=decay, seed=seed)
    h0 = torch.randn(B, HV, K, V, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
    g = None if g is None else g.float().to(device)
    return q.to(dtype).to(device), k.to(dtype).to(device), v.to(dtype).to(device), g, h0.float().to(device)


@pytest.mark.parametrize(
    ("T", "dtype", "decay"),
    [(63, torch.float32, "mixed"), (1, torch.float32, "strong"), (100, torch.bfloat16, "retnet"),
     (100, torch.bfloat16, "none")],
)  # fmt: skip
def test_triton_matches_float64(T, dtype, decay):
    q, k, v, g, h0 = _inputs(2, T, 2, 4, 32, 16, dtype, decay)
    check_against_float64(q, k, v, g, h0, tol=TOL[dtype])


def test_triton_varlen():
    lens = [5, 64, 1, 30]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEVICE)
    q, k, v, g, _ = _inputs(1, sum(lens), 2, 4, 32, 16, torch.float32, "strong")
    h0 = torch.randn(len(lens), 4, 32, 16, device=DEVICE)
    check_against_float64(q, k, v, g, h0, cu_seqlens=cu, tol=1e-4, scale=0.3)


def test_triton_decode_in_place():
    """Decode through the fused recurrent kernel writes the state in place (no new state tensor)."""
    q, k, v, g, h0 = _inputs(3, 40, 2, 4, 32, 16, torch.float32, "mixed")
    o_ref, s_ref = naive_recurrent_simple_gla(*(x.double() for x in (q, k, v, g)), None, h0.double())
    _, state = simple_gla(q[:, :37], k[:, :37], v[:, :37], g[:, :37], initial_state=h0,
                          output_final_state=True, backend="triton")  # fmt: skip
    ptr, outs = state.data_ptr(), []
    with torch.no_grad():
        for t in range(37, 40):
            sl = slice(t, t + 1)
            o_t, ret = simple_gla(q[:, sl], k[:, sl], v[:, sl], g[:, sl], initial_state=state,
                                  inplace_final_state=True, backend="triton")  # fmt: skip
            assert ret is state and ret.data_ptr() == ptr
            outs.append(o_t)
        # a few tokens at once, packed sequences, no gradient: also the fused recurrent kernel
        cu = torch.tensor([0, 2, 3, 6], device=DEVICE)
        o_v, s_v = simple_gla(q[:1, 30:36], k[:1, 30:36], v[:1, 30:36], g[:1, 30:36], output_final_state=True,
                              cu_seqlens=cu, backend="triton")  # fmt: skip
        o_r, s_r = simple_gla(q[:1, 30:36], k[:1, 30:36], v[:1, 30:36], g[:1, 30:36], output_final_state=True,
                              cu_seqlens=cu)  # fmt: skip
    assert_close("decoded o", torch.cat(outs, 1), o_ref[:, 37:], 1e-4)
    assert_close("state", state, s_ref, 1e-4)
    assert_close("varlen recurrent o", o_v, o_r, 1e-4)
    assert_close("varlen recurrent state", s_v, s_r, 1e-4)


def test_triton_compiles_fullgraph_and_counts_flops():
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v, g, h0 = _inputs(1, 20, 2, 2, 16, 16, torch.float32, "mixed")
    leaves = [x.requires_grad_() for x in (q, k, v, g, h0)]

    def f(q, k, v, g, h0):
        return simple_gla(q, k, v, g, initial_state=h0, output_final_state=True, backend="triton")

    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    o, s = torch.compile(f, fullgraph=True, backend=backend)(*leaves)
    (o.sum() + s.sum()).backward()
    q6, k6, v6, g6, h6 = (x.detach().double() for x in (q, k, v, g, h0))
    o_ref, _ = simple_gla(q6, k6, v6, g6, initial_state=h6)
    assert_close("compiled o", o, o_ref, 1e-4)
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in leaves)
    with FlopCounterMode(display=False) as counter:
        f(*leaves)[0].sum().backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    fwd = 1 * 20 * 2 * (2 * 20 * (16 + 16) + 4 * 16 * 16)
    assert counts["lt2dsl.simple_gla_chunk_fwd"] == fwd
    assert counts["lt2dsl.simple_gla_chunk_bwd"] == 2 * fwd


def test_triton_rejects_float64():
    q, k, v, g = make_inputs(1, 4, 1, 1, 16, 16)
    if DEVICE == "cuda":
        q, k, v, g = (x.cuda() for x in (q, k, v, g))
    with pytest.raises(ValueError, match="float64"):
        simple_gla(q, k, v, g, backend="triton")
    assert simple_gla(q, k, v, g, backend="auto")[0].dtype == F64


# full size on the H200: B = 2, H = 16, T ∈ {1000, 8192}, D ∈ {64, 128}, bf16 and fp32, each decay
# regime; a GVA case; kept to a few shapes because each new shape compiles every kernel again
GPU_CASES = [
    (1000, 64, torch.bfloat16, "mixed"),
    (1000, 128, torch.float32, "retnet"),
    (1000, 128, torch.bfloat16, "none"),
    (8192, 128, torch.bfloat16, "strong"),
    (8192, 128, torch.float32, "none"),
    (8192, 128, torch.bfloat16, "retnet"),
    (8192, 64, torch.float32, "mixed"),
]


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize(("T", "D", "dtype", "decay"), GPU_CASES)
def test_gpu_full_size(T, D, dtype, decay):
    q, k, v, g, h0 = _inputs(2, T, 16, 16, D, D, dtype, decay)
    check_against_float64(q, k, v, g, h0, tol=TOL[dtype])


@pytest.mark.gpu
def test_gpu_gva_varlen():
    lens = [1000, 37, 4000, 1]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEVICE)
    q, k, v, g, _ = _inputs(1, sum(lens), 4, 16, 128, 128, torch.bfloat16, "strong")
    h0 = torch.randn(len(lens), 16, 128, 128, device=DEVICE)
    check_against_float64(q, k, v, g, h0, cu_seqlens=cu, tol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("config", range(2))
def test_gpu_every_autotune_config(config):
    """Each candidate config of every decay kernel, checked on the H200 itself (README: sm_90 miscompiles)."""
    from lt2dsl.kernels.common.tiles import force_config

    try:
        force_config(config)
        for dtype in (torch.bfloat16, torch.float32):
            q, k, v, g, h0 = _inputs(2, 1000, 16, 16, 128, 128, dtype, "mixed")
            check_against_float64(q, k, v, g, h0, tol=TOL[dtype])
    finally:
        force_config(None)
