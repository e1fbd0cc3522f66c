"""Helpers of the import tests: tiny checkpoints on disk and the parity checks."""

from __future__ import annotations

import torch

from bench.hf_layouts import VOCAB

T = 9

# A looped hybrid: a recurrent state and KV caches per (iteration, block) behind one LT2Cache.
HYBRID = f"""model tiny {{
  dim = 32
  vocab = {VOCAB}
  heads = 2
  head_dim = 16
  mlp = swiglu(hidden=64)
  dtype = fp32
  loop T=2 <
    gdn(expand_v=1)
    full(qkv_bias=true, rope_dim=8)
  >
}}
"""


def hybrid_model():
    """The HYBRID program compiled with seeded random weights, carrying its source as imports do."""
    import lt2dsl

    torch.manual_seed(0)
    model = lt2dsl.compile(HYBRID, backend="reference", dtype="fp32").eval()
    model.lt2_source = HYBRID
    return model


def prompt(batch: int = 2, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, T), generator=g)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def greedy(logits_fn, ids: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy continuation by full re-forwards (no cache): the reference's tokens."""
    for _ in range(n):
        ids = torch.cat([ids, logits_fn(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids
