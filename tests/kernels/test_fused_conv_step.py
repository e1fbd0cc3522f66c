"""The decode step of up to three short convs at once (`lt2dsl.kernels.fused.conv_silu_step`): Triton
(CPU interpreter here) against the float64 reference, on irregular shapes; the histories shifted
in place exactly."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.kernels.fused.testing import TOL, assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {
    # (B, W, [(C, head_dim, bias) per conv])
    "B3-W4-qkv-hd8": (3, 4, [(24, 8, False), (24, 8, False), (40, 0, False)]),
    "B2-W3-one-C200-bias": (2, 3, [(200, 0, True)]),
    "B1-W2-qk-hd12": (1, 2, [(36, 12, False), (36, 12, True)]),
    "B2-W4-v-only-wider-C130": (2, 4, [(16, 16, False), (130, 0, True)]),
}


def _inputs(B: int, W: int, convs, g: torch.Generator):
    """xs `[B, 1, C]` as column slices of one wider tensor (what `norm_proj` produces), weights,
    biases and histories, float64."""
    total = sum(c for c, _, _ in convs) + 5
    wide = torch.randn(B, 1, total, generator=g, dtype=torch.float64)
    xs, at = [], 3
    for c, _, _ in convs:
        xs.append(wide[..., at : at + c])
        at += c
    ws = [torch.randn(c, 1, W, generator=g, dtype=torch.float64) for c, _, _ in convs]
    bs = [torch.randn(c, generator=g, dtype=torch.float64) if b else None for c, _, b in convs]
    hs = [torch.randn(B, c, W - 1, generator=g, dtype=torch.float64) for c, _, _ in convs]
    return xs, ws, bs, hs


def _to(ts, dtype):
    return [None if t is None else t.to(device=DEVICE, dtype=dtype) for t in ts]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_conv_step_matches_float64_reference(case, dtype):
    B, W, convs = case
    xs, ws, bs, hs = _inputs(B, W, convs, torch.Generator().manual_seed(0))
    hds = [hd for _, hd, _ in convs]
    # the kernel's inputs in `dtype`; the reference sees the same rounded values in float64
    txs, tws, tbs, ths = (_to(t, dtype) for t in (xs, ws, bs, hs))
    rxs, rws, rbs, rhs = ([None if t is None else t.double() for t in ts] for ts in (txs, tws, tbs, ths))
    want = naive.conv_silu_step_ref(rxs, rws, rbs, rhs, hds)
    got = fused.conv_silu_step(txs, tws, tbs, ths, head_dims=hds, backend="triton")
    for i, (y, r) in enumerate(zip(got, want, strict=True)):
        assert y.dtype == dtype and y.shape == r.shape
        assert_close(f"y{i}", y, r, TOL[dtype])
    for i, (h, r) in enumerate(zip(ths, rhs)):
        # the shifted history holds inputs, not results: exact
        torch.testing.assert_close(h.double(), r, rtol=0, atol=0, msg=f"history {i}")


def test_reference_step_equals_conv_then_history():
    """The reference is `conv_silu_ref` with the history, then the history's newest column is x."""
    xs, ws, bs, hs = _inputs(2, 4, [(8, 4, True)], torch.Generator().manual_seed(1))
    old = hs[0].clone()
    (y,) = naive.conv_silu_step_ref(xs, ws, bs, hs, [4])
    torch.testing.assert_close(y, naive.conv_silu_ref(xs[0], ws[0], bs[0], old, 4), rtol=0, atol=0)
    torch.testing.assert_close(hs[0], torch.cat([old[..., 1:], xs[0].transpose(1, 2)], -1), rtol=0, atol=0)


def test_history_of_another_dtype_falls_back_exactly():
    """A history held in another dtype than x takes the reference path (cast on read, as short_conv)."""
    xs, ws, bs, hs = _inputs(1, 3, [(10, 0, False)], torch.Generator().manual_seed(2))
    x, w, h = xs[0].float().to(DEVICE), ws[0].float().to(DEVICE), hs[0].clone().to(DEVICE)
    (y,) = fused.conv_silu_step([x], [w], [None], [h], head_dims=[0], backend="triton")
    assert h.dtype == torch.float64 and y.dtype == torch.float32
    assert_close("y", y, naive.conv_silu_ref(xs[0], ws[0], None, hs[0]), 2e-5)
    torch.testing.assert_close(h.cpu(), torch.cat([hs[0][..., 1:], x.double().cpu().transpose(1, 2)], -1))


def test_bad_arguments_raise():
    xs, ws, bs, hs = _inputs(1, 4, [(8, 0, False)] * 4, torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="1 to 3 convs"):
        fused.conv_silu_step(xs, ws, bs, hs, head_dims=[0] * 4)
    two = [torch.cat([xs[0], xs[0]], dim=1)]
    with pytest.raises(ValueError, match="one token per row"):
        fused.conv_silu_step(two, ws[:1], bs[:1], hs[:1], head_dims=[0])


def test_op_counts_flops_and_compiles():
    xs, ws, bs, hs = _inputs(2, 4, [(8, 4, False), (12, 0, False)], torch.Generator().manual_seed(4))
    xs, ws, hs = _to(xs, torch.float32), _to(ws, torch.float32), _to(hs, torch.float32)
    h_eager = [h.clone() for h in hs]
    # first: the op (and its FLOP formula) registers on first use, and FlopCounterMode reads the
    # formulas when it is made
    eager = fused.conv_silu_step(xs, ws, [None, None], h_eager, head_dims=[4, 0], backend="triton")
    h_count = [h.clone() for h in hs]
    with FlopCounterMode(display=False) as fc:
        fused.conv_silu_step(xs, ws, [None, None], h_count, head_dims=[4, 0], backend="triton")
    assert fc.get_total_flops() == 2 * 2 * (8 + 12) * 4

    def f(xs, ws, hs):
        return fused.conv_silu_step(xs, ws, [None, None], hs, head_dims=[4, 0], backend="triton")

    comp = torch.compile(f, fullgraph=True, backend="aot_eager")(xs, ws, hs)
    for a, b in zip((*comp, *hs), (*eager, *h_eager)):
        torch.testing.assert_close(a, b)
