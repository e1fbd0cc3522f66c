"""The training-memory figure: its parameter terms count the lowered model's parameters, its
activation terms are the estimate's without the full logits the chunked loss never forms."""

from __future__ import annotations

import pytest

from lt2dsl.cost.estimate import EstimateOptions, estimate
from lt2dsl.cost.train_memory import train_memory
from lt2dsl.frontend import load_or_raise

SRC = """model m {
  dim = 64
  vocab = 128
  heads = 2
  head_dim = 32
  mlp = swiglu(hidden=128)
  loop T=3 < gdn(expand_v=1); gdn(expand_v=1); gdn(expand_v=1); dsa(topk=16, index_heads=2, index_dim=16) >
}
"""


@pytest.fixture(scope="module")
def model():
    return load_or_raise(SRC).model


def test_parameter_terms_are_zero_s_16_bytes_per_parameter(model):
    pytest.importorskip("torch")
    from lt2dsl.lowering import compile_model

    N = sum(p.numel() for p in compile_model(model, device="meta", fuse=False).parameters())
    one, four = train_memory(model, 2, 128), train_memory(model, 2, 128, processes=4)
    assert (one.weights, one.grads, one.optimizer, one.copies) == (4 * N, 4 * N, 8 * N, 2 * N)
    assert (four.weights, four.grads, four.optimizer) == (N, N, 2 * N)
    assert 0 < four.copies < one.copies


def test_activations_are_the_estimates_without_full_logits(model):
    B, L = 2, 128
    rep = estimate(model, EstimateOptions(seq=L, batch=B))
    logits = B * L * 128 * 4
    mem = train_memory(model, B, L)
    assert mem.activations == rep.memory.train_activations_bytes - logits
    assert mem.activations_checkpointed == rep.memory.train_activations_recompute_bytes - logits
    assert mem.activations_checkpointed < mem.activations  # twelve applications, one recomputed
    assert mem.total(True) < mem.total(False)
    # one chunk of fp32 logits and their gradient, the head gradient, the hidden-state gradient
    assert mem.loss == 8 * B * L * 128 + 4 * 128 * 64 + 2 * B * L * 64
    small = train_memory(model, B, L, loss_chunk=64)
    assert mem.loss - small.loss == 8 * (B * L - 64) * 128
