"""Shared pieces of the decay family: varlen bookkeeping, the chunk-local cumsum kernel, and the
helpers the per-op Triton tests import (`run_fwd_bwd`, `DEVICE`, `TOL`)."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.decay.utils import chunk_indices, chunk_offsets
from tests.kernels.utils import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F64 = torch.float64
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def _flat(x):
    return list(x) if isinstance(x, tuple | list) else [x]


def run_fwd_bwd(fn, leaves, do, dstate):
    """Run `fn(*leaves) -> (o, state)`; return o, the state and the gradients of
    Σ o·do + Σ state·dstate w.r.t. the leaves (None leaves give None). `state` may be a tuple."""
    leaves = [None if x is None else x.detach().clone().requires_grad_() for x in leaves]
    o, s = fn(*leaves)
    loss = (o.double() * do).sum()
    for si, di in zip(_flat(s), _flat(dstate)):
        loss = loss + (si.double() * di).sum()
    loss.backward()
    return o, s, [None if x is None else x.grad for x in leaves]


def test_chunk_indices_and_offsets():
    cu = torch.tensor([0, 5, 69, 70, 200])
    idx = chunk_indices(cu, 64)
    assert idx.tolist() == [[0, 0], [1, 0], [2, 0], [3, 0], [3, 1], [3, 2]]
    assert chunk_offsets(cu, 64).tolist() == [0, 1, 2, 3, 6]


@pytest.mark.parametrize("vector", [False, True])
def test_chunk_local_cumsum_kernel(poison, vector):
    """Chunk-local cumsum over packed sequences and a fixed batch."""
    from lt2dsl.kernels.decay.chunks import Varlen, chunk_local_cumsum

    cu = torch.tensor([0, 5, 69, 70, 100], device=DEVICE)
    g = torch.randn(1, 100, 3, *((20,) if vector else ()), device=DEVICE)
    out = chunk_local_cumsum(g, Varlen(cu, 1, 100))
    ref = torch.empty_like(g)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        for s in range(a, b, 64):
            e = min(s + 64, b)
            ref[:, s:e] = g[:, s:e].cumsum(1)
    assert_close("cumsum", out, ref, 1e-6)
    fixed = chunk_local_cumsum(g.view(2, 50, *g.shape[2:]), Varlen(None, 2, 50))
    assert_close("fixed-length cumsum", fixed, g.view(2, 50, *g.shape[2:]).cumsum(1), 1e-6)
