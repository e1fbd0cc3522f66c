"""`gla` against its float64 recurrence: chunked form, strong decays, gradients, states, GVA, varlen."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lt2dsl.kernels.gla import chunk_gla_ref, gla, naive_recurrent_gla
from tests.kernels.utils import assert_close

F64 = torch.float64


def make_inputs(B, T, H, HV, K, V, dtype=F64, decay="gla", seed=0, device="cpu"):
    """q, k `[B, T, H, K]`, v `[B, T, HV, V]`, g `[B, T, HV, K]` (fp32 unless float64)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=gen, dtype=F64)

    q, k, v = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, HV, V)
    if decay == "gla":  # logσ(x) / 16 as in fla's GLA layer: close to 1
        g = F.logsigmoid(rnd(B, T, HV, K)) / 16
    elif decay == "strong":  # down to −8 per step: e^{−b} overflows fp32 within one 64-chunk
        g = -8 * torch.rand(B, T, HV, K, generator=gen, dtype=F64)
    else:
        g = F.logsigmoid(rnd(B, T, HV, K) + 1)
    cast = [x.to(dtype).to(device) for x in (q, k, v)]
    return (*cast, (g if dtype == F64 else g.float()).to(device))


@pytest.mark.parametrize("T", [1, 63, 100])
@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("decay", ["gla", "mixed", "strong"])
def test_chunk_equals_recurrence(T, chunk, decay):
    q, k, v, g = make_inputs(2, T, 2, 4, 16, 8, decay=decay, seed=T)
    h0 = torch.randn(2, 4, 16, 8, dtype=F64)
    o_ref, s_ref = naive_recurrent_gla(q, k, v, g, 0.25, h0)
    o, s = chunk_gla_ref(q, k, v, g, 0.25, h0, chunk_size=chunk)
    assert_close("o", o, o_ref, 1e-10)
    assert_close("final_state", s, s_ref, 1e-10)


def test_strong_decay_fp32_has_no_overflow():
    """Sub-chunking keeps every exponent ≤ 0: fp32 with −8 per step stays finite and accurate."""
    q, k, v, g = make_inputs(1, 100, 2, 2, 16, 8, decay="strong")
    o_ref, _ = naive_recurrent_gla(q, k, v, g, 0.25)
    o, _ = gla(q.float(), k.float(), v.float(), g.float(), scale=0.25)
    assert_close("o", o, o_ref, 1e-5)


def test_gradcheck_reference():
    q, k, v, g = make_inputs(1, 7, 1, 2, 3, 2, seed=3)
    h0 = torch.randn(1, 2, 3, 2, dtype=F64)
    leaves = [x.requires_grad_() for x in (q, k, v, g, h0)]

    def f(q, k, v, g, h0):
        return gla(q, k, v, g, initial_state=h0, output_final_state=True, backend="reference")

    assert torch.autograd.gradcheck(f, leaves, fast_mode=True)


def test_gradcheck_subchunks_across_chunks():
    q, k, v, g = make_inputs(1, 37, 1, 1, 2, 2, seed=4)
    leaves = [x.requires_grad_() for x in (q, k, v, g)]
    assert torch.autograd.gradcheck(
        lambda *a: chunk_gla_ref(*a, 0.7, None, chunk_size=32), leaves, fast_mode=True
    )


def test_decode_after_prefill_equals_one_shot():
    q, k, v, g = make_inputs(2, 40, 2, 2, 8, 4)
    o_all, s_all = gla(q, k, v, g, output_final_state=True)
    o1, s1 = gla(q[:, :35], k[:, :35], v[:, :35], g[:, :35], output_final_state=True)
    state, outs = s1.clone(), []
    for t in range(35, 40):
        sl = slice(t, t + 1)
        o_t, ret = gla(q[:, sl], k[:, sl], v[:, sl], g[:, sl], initial_state=state, inplace_final_state=True)
        assert ret is state
        outs.append(o_t)
    assert_close("o", torch.cat([o1, *outs], 1), o_all, 1e-12)
    assert_close("state", state, s_all, 1e-12)


def test_gva_equals_repeated_heads():
    q, k, v, g = make_inputs(1, 30, 2, 4, 8, 4)
    o, s = gla(q, k, v, g, output_final_state=True)
    o2, s2 = gla(q.repeat_interleave(2, 2), k.repeat_interleave(2, 2), v, g, output_final_state=True)
    assert_close("o", o, o2, 1e-12)
    assert_close("state", s, s2, 1e-12)


def test_cu_seqlens_equals_separate_runs():
    lens = [5, 37, 1, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    q, k, v, g = make_inputs(1, sum(lens), 2, 4, 8, 4)
    h0 = torch.randn(len(lens), 4, 8, 4, dtype=F64)
    o, s = gla(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    for n in range(len(lens)):
        a, b = cu[n].item(), cu[n + 1].item()
        o_n, s_n = naive_recurrent_gla(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], 8**-0.5, h0[n : n + 1])
        assert_close(f"o[{n}]", o[:, a:b], o_n, 1e-10)
        assert_close(f"state[{n}]", s[n : n + 1], s_n, 1e-10)


def test_shape_errors():
    q, k, v, g = make_inputs(1, 8, 2, 4, 8, 4)
    with pytest.raises(ValueError, match=r"\[B, T, HV, K\]"):
        gla(q, k, v, g[..., 0])
    with pytest.raises(ValueError, match=r"\[B, T, HV, V\]"):
        gla(q, k, v[0], g)
    with pytest.raises(ValueError, match=r"\[N, HV, K, V\]"):
        gla(q, k, v, g, initial_state=torch.zeros(2, 4, 8, 4))
    with pytest.raises(ValueError, match="dtype"):
        gla(q, k, v.float(), g)
