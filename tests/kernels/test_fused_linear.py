"""The concatenated projections of the `norm_proj` rule: one GEMM, aligned output rows."""

from __future__ import annotations

import torch

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive


def _weights(sizes, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(n, dim, generator=g, dtype=torch.float64, requires_grad=True) for n in sizes]
    bs = [torch.randn(n, generator=g, dtype=torch.float64, requires_grad=True) if i % 2 else None
          for i, n in enumerate(sizes)]  # fmt: skip
    return ws, bs


def test_misaligned_sizes_are_padded_and_dropped():
    """DSA's projections add up to a row count that is not a multiple of 8 (6468 at dim 2048):
    the GEMM output's rows must stay 16-byte aligned in bf16, and the slices exactly the sizes."""
    sizes = [64, 64, 64, 16, 8, 2]  # 218 columns: 6 short of a multiple of 8
    ws, bs = _weights(sizes)
    x = torch.randn(3, 5, 32, dtype=torch.float64, requires_grad=True)
    W = fused.concat_weights(*ws)
    assert W.shape[0] % fused.CAT_ALIGN == 0 and W.shape[0] > sum(sizes)
    b = fused.concat_biases(sizes, *bs)
    outs = fused.linear_split(x, W, b, sizes)
    assert [o.shape[-1] for o in outs] == sizes
    assert outs[0].stride(-2) % fused.CAT_ALIGN == 0
    refs = naive.linear_split_ref(x, ws, bs)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r)
    # gradients reach every original weight and bias through the padded cat
    sum((o * (i + 1)).sum() for i, o in enumerate(outs)).backward()
    g_fused = [w.grad.clone() for w in ws] + [b_.grad.clone() for b_ in bs if b_ is not None]
    for t in [*ws, *[b_ for b_ in bs if b_ is not None], x]:
        t.grad = None
    sum((r * (i + 1)).sum() for i, r in enumerate(naive.linear_split_ref(x, ws, bs))).backward()
    g_ref = [w.grad for w in ws] + [b_.grad for b_ in bs if b_ is not None]
    for a, r in zip(g_fused, g_ref):
        torch.testing.assert_close(a, r)


def test_aligned_sizes_are_not_padded():
    ws, _ = _weights([64, 32, 32])
    assert fused.concat_weights(*ws).shape[0] == 128
