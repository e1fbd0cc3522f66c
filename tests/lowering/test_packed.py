"""Packed rows: `LT2Model(ids [1, T], cu_seqlens=...)` equals running every document alone.

For every layer kind (float64, reference kernels): attention is masked at document bounds,
recurrent states and short-conv histories restart, and RoPE / xPos / Toeplitz positions restart
at 0 — any leak across a bound changes the later documents' logits. The documents are 5, 1 and 7
tokens long, so windows, top-k, NSA blocks and conv widths all straddle a bound.
"""

from __future__ import annotations

import pytest
import torch

from .util import KINDS, call, lower, tokens

LENGTHS = (5, 1, 7)


def cu_of(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def separately(model, ids: torch.Tensor, lengths) -> torch.Tensor:
    outs, t = [], 0
    for n in lengths:
        outs.append(model(ids[:, t : t + n]))
        t += n
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("kind", KINDS)
def test_packed_row_equals_separate_documents(kind):
    model = lower(f"{call(kind)}; {call(kind)}")
    ids = tokens(1, sum(LENGTHS))
    packed = model(ids, cu_seqlens=cu_of(LENGTHS))
    torch.testing.assert_close(packed, separately(model, ids, LENGTHS), rtol=1e-9, atol=1e-9)
    # without the bounds the later documents see the earlier ones: the test can tell
    assert not torch.allclose(model(ids)[:, LENGTHS[0] :], packed[:, LENGTHS[0] :], atol=1e-6)


def test_looped_hybrid_packed_forward_and_gradients():
    body = f"loop T=2 < {call('gdn')}; {call('dsa')} >"
    model = lower(body)
    ids = tokens(1, sum(LENGTHS))
    out = model(ids, cu_seqlens=cu_of(LENGTHS))
    # the DSA indexer learns from its own loss only: no LM gradient reaches it
    params = [p for name, p in model.named_parameters() if ".idx_" not in name]
    grads = torch.autograd.grad(out.square().sum(), params)
    ref = separately(model, ids, LENGTHS)
    ref_grads = torch.autograd.grad(ref.square().sum(), params)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kind", ["gdn", "mamba2"])
def test_fused_graph_keeps_document_bounds(kind):
    """The fusion pass's conv rules carry `cu_seqlens` into the fused short convs."""
    model = lower(call(kind), fuse=True)
    code = model.graph_module.code
    assert ("conv_silu_group_cached" if kind == "gdn" else "conv_silu_cached") in code
    ids = tokens(1, sum(LENGTHS))
    packed = model(ids, cu_seqlens=cu_of(LENGTHS))
    torch.testing.assert_close(packed, separately(model, ids, LENGTHS), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    ("ids", "cu", "cache", "message"),
    [
        (tokens(2, 6), torch.tensor([0, 6], dtype=torch.int32), False, "packed in one row"),
        (tokens(1, 6), torch.tensor([0, 3, 5], dtype=torch.int32), False, "end at T=6"),
        (tokens(1, 6), torch.tensor([0, 3, 3, 6], dtype=torch.int32), False, "strictly increasing"),
        (tokens(1, 6), torch.tensor([0.0, 6.0]), False, "int32"),
        (tokens(1, 6), torch.tensor([[0, 6]], dtype=torch.int32), False, "1-D integer tensor"),
        (tokens(1, 6), torch.tensor([0, 6], dtype=torch.int32), True, "decode cache"),
    ],
)
def test_bad_cu_seqlens_is_a_clear_error(ids, cu, cache, message):
    model = lower(call("gdn"))
    with pytest.raises(ValueError, match=message):
        model(ids, model.new_cache(ids.shape[0]) if cache else None, cu_seqlens=cu)


@pytest.mark.parametrize("rotate", ["rope", "xpos"])
def test_positions_restart_at_document_starts(rotate):
    """Rotations are relative inside attention, so the model test cannot see absolute positions:
    check the rotated q / k themselves."""
    from lt2dsl.lowering.functional import apply_rope
    from lt2dsl.lowering.functional_recurrent import xpos_rotate

    def fn(x, cu=None):
        return apply_rope(x, 0, 10000.0, cu_seqlens=cu) if rotate == "rope" else xpos_rotate(x, 0, cu)

    x = torch.randn(1, sum(LENGTHS), 2, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    whole = fn(x, cu_of(LENGTHS))
    docs = torch.cat([fn(d) for d in x.split(LENGTHS, dim=1)], dim=1)
    torch.testing.assert_close(whole, docs, rtol=0, atol=1e-12)
    assert not torch.allclose(fn(x)[:, LENGTHS[0] :], whole[:, LENGTHS[0] :])
