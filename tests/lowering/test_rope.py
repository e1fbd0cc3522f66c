"""RoPE: the cached cos/sin table a decode step slices equals the per-call computation."""

from __future__ import annotations

import torch

from lt2dsl.lowering import functional as lf


def test_table_rows_equal_the_direct_computation_and_regrow():
    lf._ROPE_TABLES.clear()
    cos, sin = lf.rope_table(16, 10000.0, 10, torch.device("cpu"), torch.float32)
    assert cos.shape[0] >= 10
    c2, s2 = lf.rope_rows(16, 10000.0, torch.arange(3, 7), torch.float32)
    assert torch.equal(cos[3:7], c2) and torch.equal(sin[3:7], s2)
    n = cos.shape[0]
    big, _ = lf.rope_table(16, 10000.0, n + 1, torch.device("cpu"), torch.float32)  # regrown
    assert big.shape[0] >= max(n + 1, 2 * n) and torch.equal(big[:n], cos)


def test_apply_rope_matches_the_uncached_rotation():
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64)
    out = lf.apply_rope(x, 7, 500.0)
    cos, sin = lf.rope_freqs(8, 500.0, torch.arange(7, 12), torch.float64)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    ref = torch.cat([x[..., :4] * cos - x[..., 4:] * sin, x[..., 4:] * cos + x[..., :4] * sin], dim=-1)
    torch.testing.assert_close(out, ref, rtol=1e-14, atol=1e-14)


def test_table_built_under_inference_mode_serves_training():
    lf._ROPE_TABLES.clear()
    x = torch.randn(1, 4, 2, 8)
    with torch.inference_mode():
        lf.apply_rope(x, 0, 10000.0)  # builds the table here
    y = x.clone().requires_grad_()
    lf.apply_rope(y, 2, 10000.0).square().sum().backward()  # saves a slice of it for backward
    assert y.grad is not None and torch.isfinite(y.grad).all()
