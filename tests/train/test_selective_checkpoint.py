"""Selective per-application checkpointing (`training.checkpoint_keep = ["attention"]`): the attention
forwards run once per application instead of twice, the hidden states and every gradient equal the
plain and the fully recomputed runs', and what the kept ops return is what the estimate counts for
them (`LayerSpec.kept_outputs`). CPU, the Triton kernels interpreted."""

from __future__ import annotations

import pytest
import torch

import lt2dsl
from lt2dsl.cost.estimate import block_kept
from lt2dsl.cost.train_memory import train_memory
from lt2dsl.kernels.attention import ops as attention_ops
from lt2dsl.kernels.dsa import ops as dsa_ops
from lt2dsl.passes.resolve import blocks
from lt2dsl.train.parallel import TrainModel, kept_ops

SRC = """model m {
  dim = 32
  vocab = 64
  heads = 2
  head_dim = 16
  max_len = 64
  mlp = swiglu(hidden=64)
  loop T=2 <
    full
    dsa(topk=8, index_heads=2, index_dim=16)
    nsa(block=4, select=2, window=8, cmp_block=4, stride=4, kv_heads=1)
  >
}
"""


@pytest.fixture
def counted(monkeypatch):
    """Calls of the attention forwards' launchers, and the bytes of what they return."""
    seen = {"attention": 0, "sparse": 0, "bytes": 0}

    def counting(name, fn):
        def run(*args, **kwargs):
            o, lse = fn(*args, **kwargs)
            seen[name] += 1
            seen["bytes"] += o.numel() * o.element_size() + lse.numel() * lse.element_size()
            return o, lse

        return run

    monkeypatch.setattr(attention_ops, "attn_fwd", counting("attention", attention_ops.attn_fwd))
    monkeypatch.setattr(dsa_ops, "sparse_attn_fwd", counting("sparse", dsa_ops.sparse_attn_fwd))
    return seen


def run(model, keep, checkpointed, ids, seen):
    tm = TrainModel(model, checkpointed, keep=keep)
    for p in tm.parameters():
        p.grad = None
    h = tm(ids)
    forward = dict(seen)
    (h * torch.linspace(-1, 1, h.shape[-1])).sum().backward()
    grads = {n: p.grad.clone() for n, p in tm.named_parameters() if p.grad is not None}
    return h.detach(), grads, forward


def test_kept_attention_runs_once_and_changes_no_gradient(counted):
    torch.manual_seed(0)
    model = lt2dsl.compile(SRC, backend="triton", dtype=torch.float32)
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    results, calls = {}, {}
    for way, keep, ckpt in (("plain", (), False), ("recompute", (), True), ("keep", ("attention",), True)):
        counted.update(attention=0, sparse=0, bytes=0)
        results[way] = run(model, keep, ckpt, ids, counted)
        calls[way] = (counted["attention"], counted["sparse"])
    # per application: full 1 + nsa 2 (compressed, window) attention forwards; dsa 1 + nsa 1 sparse
    per_forward = (2 * 3, 2 * 2)
    assert calls["plain"] == per_forward
    assert calls["keep"] == per_forward
    assert calls["recompute"] == (2 * per_forward[0], 2 * per_forward[1])
    h, grads, _ = results["plain"]
    assert len(grads) > 20
    for way in ("recompute", "keep"):
        h2, grads2, _ = results[way]
        assert torch.equal(h2, h), way
        assert grads2.keys() == grads.keys(), way
        for name, g in grads.items():
            assert torch.isfinite(g).all(), name
            assert torch.equal(grads2[name], g), (way, name)


def test_kept_outputs_are_what_the_estimate_counts(counted):
    """One bf16 forward: the kept ops' o and fp32 lse are `block_kept` elements of 2 bytes per token
    and application (the trainer's training-memory term)."""
    torch.manual_seed(0)
    model = lt2dsl.compile(SRC, backend="triton", dtype=torch.bfloat16)
    B, T = 1, 16
    with torch.no_grad():
        model(torch.randint(0, 64, (B, T)))
    ir = model.ir
    kept = sum(block_kept(blk, ir.config) * it for blk, it in blocks(ir.body))
    assert kept > 0 and counted["bytes"] == 2 * B * T * kept
    with_keep, without = train_memory(ir, B, T), train_memory(ir, B, T, keep_attention=False)
    assert with_keep.activations_checkpointed - without.activations_checkpointed == 2 * B * T * kept


def test_unknown_keep_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown \\['mlp'\\]"):
        kept_ops(("attention", "mlp"))
    assert kept_ops(()) == []


def test_kept_attention_inside_compiled_blocks(counted):
    """`training.compile` with checkpointing: the blocks' traced graphs (the `eager` backend, the
    same graphs without code generation) still hand the kept outputs to the recompute."""
    from torch._dynamo.utils import counters

    from lt2dsl.train.parallel import compile_block

    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    got = {}
    for keep in ((), ("attention",)):
        torch.manual_seed(0)
        torch._dynamo.reset()
        counters.clear()
        model = lt2dsl.compile(SRC, backend="triton", dtype=torch.float32)
        tm = TrainModel(model, True, keep=keep)
        for block in tm.blocks:
            compile_block(block, "eager")
        counted.update(attention=0, sparse=0)
        h = tm(ids)
        (h * torch.linspace(-1, 1, h.shape[-1])).sum().backward()
        assert not counters["graph_break"]
        got[keep] = h.detach(), [p.grad for p in tm.parameters() if p.grad is not None], dict(counted)
    torch._dynamo.reset()
    (h0, g0, c0), (h1, g1, c1) = got[()], got[("attention",)]
    assert (c1["attention"], c1["sparse"]) == (c0["attention"] // 2, c0["sparse"] // 2) == (6, 4)
    assert torch.equal(h0, h1) and all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))
