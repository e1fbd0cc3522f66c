"""A trained-shaped `tmm` layer's table, and the index against the layer's own operator: a
lower-triangular Toeplitz section T_n(a) of a symbol with winding m has exactly m singular values
that vanish as n grows (like |r|^n for a zero r inside the disc), the rest staying O(1)."""

from __future__ import annotations

import numpy as np
import torch

import lt2dsl
from lt2dsl.analysis.toeplitz import toeplitz_layers

N = 48


def tmm_model(heads: int, kernel: int, dim: int = 8):
    body = f"tmm(heads={heads}, kernel={kernel})"
    text = f"model t {{\n  dim = {dim}\n  vocab = 4\n  max_len = {N}\n  {body}\n}}\n"
    return lt2dsl.compile(text, backend="reference", dtype=torch.float64)


def test_layer_table_reads_the_trained_weights():
    model = tmm_model(heads=2, kernel=2)
    with torch.no_grad():
        w = model.blocks[0].mixers[0].w  # [kernel, heads, n]
        w.zero_()
        w[1, 0, :3] = torch.tensor(np.poly([0.5, -0.6])[::-1].copy())
        w[1, 1, :2] = torch.tensor([1.0, 0.5])
        w[0, :, 1] = 1.0
    (layer,) = toeplitz_layers(model)
    assert (layer.block, layer.heads, layer.kernel, layer.channels, layer.length) == (0, 2, 2, 8, N)
    assert [r.winding for r in layer.symbols if r.diagonal] == [2, 0]
    assert layer.index == -(8 // 2) * 2
    assert toeplitz_layers(model, length=1)[0].index == 0  # w[:, :, :1] is a constant symbol


def test_small_singular_values_of_the_layer_operator_match_the_winding():
    model = tmm_model(heads=1, kernel=1, dim=1)
    mixer = model.blocks[0].mixers[0]
    # a real symbol with a conjugate pair of zeros inside the disc and two real zeros outside
    coeffs = np.real(np.poly([0.4 + 0.3j, 0.4 - 0.3j, -2.0, 1.5])[::-1]).copy()
    with torch.no_grad():
        mixer.w.zero_()
        mixer.w[0, 0, :5] = torch.tensor(coeffs)
        mixer.bias.zero_()
        # the layer's operator, column by column: its responses to unit impulses
        x = torch.eye(N, dtype=torch.float64)[:, :, None]  # [B = N impulses, T = N, C = 1]
        M = mixer(x)[..., 0].T  # M[t, s]: the response at t to an impulse at s
    (layer,) = toeplitz_layers(model)
    assert layer.symbols[0].winding == 2 and layer.index == -2
    sv = np.linalg.svd(M.numpy(), compute_uv=False)
    assert int((sv < 1e-6 * sv.max()).sum()) == 2 and sv[-3] > 1e-2 * sv.max()
