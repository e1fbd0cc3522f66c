"""`gla` against its float64 recurrence: chunked form, strong decays, gradients, states, GVA, varlen."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lt2dsl.kernels.gla import chunk_gla_ref, gla, naive_recurrent_gla
from tests.kernels.test_decay_common import DEVICE, TOL, run_fwd_bwd
from tests.kernels.utils import assert_close

F64 = torch.float64
# Triton launchers allocate NaN-filled buffers in every test of this file
pytestmark = pytest.mark.usefixtures("poison")


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
    elif decay == "patchy":  # GLA gates with a strong patch: sub-chunks and channel slices of both kinds
        g = F.logsigmoid(rnd(B, T, HV, K)) / 16
        g[:, 20:40, :, : max(1, K // 2)] = -8 * torch.rand(B, min(T, 40) - min(T, 20), HV, max(1, K // 2),
                                                           generator=gen, dtype=F64)  # fmt: skip
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


# ---------------------------------------------------------------------------------------------
# backend="triton" (CPU: Triton interpreter at small shapes; GPU: the same checks at full size)


def check_against_float64(q, k, v, g, h0, cu_seqlens=None, tol=1e-4, scale=None):
    """Triton forward + backward versus float64 (recurrence on CPU, chunked float64 form on GPU)."""
    gen = torch.Generator().manual_seed(11)
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    do = torch.randn(*v.shape, generator=gen, dtype=F64).to(v.device)
    dht = torch.randn(N, v.shape[2], q.shape[3], v.shape[3], generator=gen, dtype=F64).to(v.device)
    kw = dict(scale=scale, output_final_state=True, cu_seqlens=cu_seqlens)

    def tri(q, k, v, g, h0):
        return gla(q, k, v, g, initial_state=h0, backend="triton", **kw)

    def ref(q, k, v, g, h0):
        if v.is_cuda or cu_seqlens is not None:
            return gla(q, k, v, g, initial_state=h0, backend="reference", **kw)
        return naive_recurrent_gla(q, k, v, g, scale, h0)

    o, s, grads = run_fwd_bwd(tri, [q, k, v, g, h0], do, dht)
    o64, s64, grads64 = run_fwd_bwd(ref, [x.double() for x in (q, k, v, g, h0)], do, dht)
    assert o.dtype == v.dtype and s.dtype == torch.float32
    assert_close("o", o, o64, tol)
    assert_close("final_state", s, s64, tol)
    for name, a, b in zip(["dq", "dk", "dv", "dg", "dh0"], grads, grads64):
        assert_close(name, a, b, tol)


def _inputs(B, T, H, HV, K, V, dtype, decay, device=DEVICE, seed=0):
    q, k, v, g = make_inputs(B, T, H, HV, K, V, decay=decay, seed=seed)
    h0 = torch.randn(B, HV, K, V, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
    return (*(x.to(dtype).to(device) for x in (q, k, v)), g.float().to(device), h0.float().to(device))


@pytest.mark.parametrize(
    ("B", "T", "dtype", "decay"),
    [
        (1, 100, torch.float32, "strong"),
        (2, 63, torch.bfloat16, "gla"),
        (2, 1, torch.float32, "mixed"),
        (1, 90, torch.float32, "patchy"),
        (1, 70, torch.bfloat16, "patchy"),
        # fp16 operands hold e^11 at most: the diagonal blocks take the dot only up to e^8
        (1, 90, torch.float16, "mixed"),
        (1, 70, torch.float16, "patchy"),
    ],
)
def test_triton_matches_float64(B, T, dtype, decay):
    q, k, v, g, h0 = _inputs(B, T, 1, 2, 32, 16, dtype, decay)
    check_against_float64(q, k, v, g, h0, tol=TOL[dtype])


@pytest.mark.parametrize("span", ["dot", "elementwise"])
def test_triton_diagonal_block_forms(monkeypatch, span):
    """The diagonal sub-chunk blocks as one dot (moderate decay) or elementwise (strong decay): both
    forms on the same inputs, forced through the span limit."""
    from lt2dsl.kernels.gla import chunk

    monkeypatch.setattr(chunk, "diag_span", lambda fp16: 1e4 if span == "dot" else -1.0)
    q, k, v, g, h0 = _inputs(1, 75, 1, 1, 32, 16, torch.float32, "mixed")
    check_against_float64(q, k, v, g, h0, tol=1e-4)


def test_triton_varlen():
    lens = [5, 70, 1]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEVICE)
    q, k, v, g, _ = _inputs(1, sum(lens), 2, 2, 16, 16, torch.float32, "strong")
    h0 = torch.randn(len(lens), 2, 16, 16, device=DEVICE)
    check_against_float64(q, k, v, g, h0, cu_seqlens=cu, tol=1e-4, scale=0.3)


def test_triton_decode_in_place():
    """Decode through the fused recurrent kernel writes the state in place (no new state tensor)."""
    q, k, v, g, h0 = _inputs(2, 12, 2, 4, 32, 16, torch.float32, "strong")
    o_ref, s_ref = naive_recurrent_gla(*(x.double() for x in (q, k, v, g)), None, h0.double())
    state = h0.clone()
    ptr, outs = state.data_ptr(), []
    with torch.no_grad():
        o_pre, ret = gla(q[:, :9], k[:, :9], v[:, :9], g[:, :9], initial_state=state,
                         inplace_final_state=True, backend="triton")  # fmt: skip
        for t in range(9, 12):
            sl = slice(t, t + 1)
            o_t, ret = gla(q[:, sl], k[:, sl], v[:, sl], g[:, sl], initial_state=state,
                           inplace_final_state=True, backend="triton")  # fmt: skip
            assert ret is state and ret.data_ptr() == ptr
            outs.append(o_t)
    assert_close("decoded o", torch.cat([o_pre, *outs], 1), o_ref, 1e-4)
    assert_close("state", state, s_ref, 1e-4)


def test_triton_compiles_fullgraph_and_counts_flops():
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v, g, h0 = _inputs(1, 20, 1, 1, 16, 16, torch.float32, "gla")
    leaves = [x.requires_grad_() for x in (q, k, v, g, h0)]

    def f(q, k, v, g, h0):
        return gla(q, k, v, g, initial_state=h0, output_final_state=True, backend="triton")

    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    o, s = torch.compile(f, fullgraph=True, backend=backend)(*leaves)
    (o.sum() + s.sum()).backward()
    q6, k6, v6, g6, h6 = (x.detach().double() for x in leaves)
    assert_close("compiled o", o, gla(q6, k6, v6, g6, initial_state=h6)[0], 1e-4)
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in leaves)
    with FlopCounterMode(display=False) as counter:
        f(*leaves)[0].sum().backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    fwd = 20 * (2 * 20 * (16 + 16) + 4 * 16 * 16 + 3 * 16 * 16)
    assert counts["lt2dsl.gla_chunk_fwd"] == fwd
    assert counts["lt2dsl.gla_chunk_bwd"] == 2 * fwd


# full size on the H200 (B = 2, H = 16), few shapes: each new shape compiles every kernel again
GPU_CASES = [
    (1000, 64, torch.bfloat16, "gla"),
    (1000, 128, torch.float32, "strong"),
    (8192, 128, torch.bfloat16, "gla"),
    (8192, 128, torch.float32, "gla"),
    (8192, 128, torch.bfloat16, "strong"),
    (1000, 128, torch.bfloat16, "patchy"),
    (1000, 128, torch.float16, "mixed"),
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
    q, k, v, g, _ = _inputs(1, sum(lens), 4, 16, 128, 128, torch.bfloat16, "gla")
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
            q, k, v, g, h0 = _inputs(2, 1000, 16, 16, 128, 128, dtype, "strong")
            check_against_float64(q, k, v, g, h0, tol=TOL[dtype])
    finally:
        force_config(None)
