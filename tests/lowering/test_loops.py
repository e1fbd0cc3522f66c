"""Loop, block and model semantics of the lowering (language.md §4, mixers.md §14).

Each test writes the expected computation out by hand with the model's own submodules, called
eagerly (not through the traced graph): the order of blocks and iterations, weight sharing,
final norms, injection, exit gates, `par`, sandwich norms and the head.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .util import call, lower, run_chunks, tokens

GDN, SWA = call("gdn"), call("swa")


def blk(model, i, h):
    return model.blocks[i](h, None, 0)


def head(model, h):
    return F.linear(h, model.embed.weight)


def test_loop_body_runs_T_times_with_shared_weights():
    model = lower(f"loop T=3 < {GDN}; {SWA} >")
    ids = tokens(2, 9)
    h = model.embed(ids)
    for _ in range(3):
        h = blk(model, 1, blk(model, 0, h))
    torch.testing.assert_close(model(ids), head(model, model.final_norm(h)), rtol=1e-12, atol=1e-12)
    # One set of weights, called three times by the graph.
    targets = [nd.target for nd in model.graph_module.graph.nodes if nd.op == "call_module"]
    assert targets.count("blocks.0.mixers.0.q_proj") == 3
    assert targets.count("blocks.1.mixers.0.o_proj") == 3


def test_T1_loop_equals_the_stack_without_a_loop():
    looped = lower(f"loop T=1 < {GDN}; {SWA} >", seed=0)
    plain = lower(f"{GDN}; {SWA}", seed=1)
    plain.load_state_dict(looped.state_dict())
    ids = tokens(2, 10)
    torch.testing.assert_close(looped(ids), plain(ids), rtol=0, atol=0)
    normed = lower(f"loop T=1, final_norm=true < {GDN}; {SWA} >", seed=2)
    normed.load_state_dict(looped.state_dict())
    torch.testing.assert_close(normed(ids), plain(ids), rtol=0, atol=0)


def test_loop_T_override_reuses_the_weights():
    two = lower(f"loop T=2 < {GDN}; {SWA} >")
    four = lower(f"loop T=2 < {GDN}; {SWA} >", overrides={"loop_T": 4}, seed=5)
    shapes = [{k: v.shape for k, v in m.state_dict().items()} for m in (two, four)]
    assert shapes[0] == shapes[1]
    four.load_state_dict(two.state_dict())  # strict: same names, same shapes
    ids = tokens(1, 8)
    h = four.embed(ids)
    for _ in range(4):
        h = blk(four, 1, blk(four, 0, h))
    torch.testing.assert_close(four(ids), head(four, four.final_norm(h)), rtol=1e-12, atol=1e-12)
    assert len(four.new_cache(1).entries) == 8
    # A resolved Model takes the override too.
    again = lower(f"loop T=2 < {GDN}; {SWA} >", overrides={"loop.T": 3})
    assert again.ir.body[0].T == 3 and again.applications == 6


def test_final_norm_after_every_iteration_and_not_again():
    model = lower(f"loop T=2, final_norm=true < {GDN} >")
    ids = tokens(2, 6)
    h = model.embed(ids)
    for _ in range(2):
        h = model.final_norm(blk(model, 0, h))
    torch.testing.assert_close(model(ids), head(model, h), rtol=1e-12, atol=1e-12)


def test_final_norm_loop_followed_by_a_block_gets_the_model_norm_at_the_end():
    model = lower(f"loop T=2, final_norm=true < {GDN} >; {SWA}")
    ids = tokens(1, 6)
    h = model.embed(ids)
    for _ in range(2):
        h = model.final_norm(blk(model, 0, h))
    h = model.final_norm(blk(model, 1, h))
    torch.testing.assert_close(model(ids), head(model, h), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("inject", ["add", "concat"])
def test_inject_reinjects_the_embedding_after_the_first_iteration(inject):
    model = lower(f"loop T=3, inject={inject} < {SWA} >")
    ids = tokens(2, 7)
    e = model.embed(ids)
    h = e
    for t in range(3):
        if t and inject == "add":
            h = h + e
        elif t:
            h = model.loops[0].adapter(torch.cat([h, e], dim=-1))
        h = blk(model, 0, h)
    torch.testing.assert_close(model(ids), head(model, model.final_norm(h)), rtol=1e-12, atol=1e-12)


def exit_reference(model, ids):
    """States h^(τ) and exit probabilities p_τ of a `loop T=3, final_norm, exit=gate` model."""
    h, hs, lams = model.embed(ids), [], []
    for _ in range(3):
        h = model.final_norm(blk(model, 0, h))
        hs.append(h)
        lams.append(torch.sigmoid(model.loops[0].exit(h))[..., 0])
    l1, l2, _ = lams
    p = torch.stack([l1, (1 - l1) * l2, (1 - l1) * (1 - l2)], dim=-1)  # [B, L, 3]
    return torch.stack(hs, dim=-2), p


def test_exit_gate_training_mixes_the_iterations():
    model = lower(f"loop T=3, final_norm=true, exit=gate(threshold=0.5) < {SWA} >")
    with torch.no_grad():
        model.loops[0].exit.weight.normal_(0, 1.0)  # spread λ away from 1/2
    ids = tokens(2, 6)
    H, p = exit_reference(model, ids)
    out = model(ids)
    torch.testing.assert_close(out, head(model, (p[..., None] * H).sum(-2)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.exit_probs, p.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.exit_probs.sum(-1), torch.ones(2, 6, dtype=torch.float64))


@pytest.mark.parametrize("threshold", [1e-9, 0.5, 1.0])
def test_exit_gate_eval_takes_the_first_iteration_past_the_threshold(threshold):
    model = lower(f"loop T=3, final_norm=true, exit=gate(threshold={threshold}) < {SWA} >").eval()
    with torch.no_grad():
        model.loops[0].exit.weight.normal_(0, 1.0)
        ids = tokens(2, 6)
        H, p = exit_reference(model, ids)
        out = model(ids)
    cum = p.cumsum(-1)
    for b in range(2):
        for t in range(6):
            tau = next((i for i in range(3) if cum[b, t, i] >= threshold), 2)
            torch.testing.assert_close(out[b, t], head(model, H[b, t, tau]), rtol=1e-12, atol=1e-12)
    if threshold == 1e-9:
        torch.testing.assert_close(out, head(model, H[..., 0, :]), rtol=1e-12, atol=1e-12)


def test_par_sums_the_mixers_on_the_same_normed_input():
    model = lower(f"par({GDN}, {SWA})")
    ids = tokens(2, 5)
    b = model.blocks[0]
    h = model.embed(ids)
    x = b.norms[0](h)
    h = h + b.mixers[0](x, None, 0) + b.mixers[1](x, None, 0)
    h = h + b.mlp(b.norms[1](h))
    torch.testing.assert_close(model(ids), head(model, model.final_norm(h)), rtol=1e-12, atol=1e-12)


def test_sandwich_block_and_gelu_mlp_with_layernorm():
    model = lower(SWA, norm="sandwich", mlp="gelu(hidden=48)")
    b = model.blocks[0]
    assert len(b.norms) == 4
    ids = tokens(1, 5)
    h = model.embed(ids)
    h = h + b.norms[1](b.mixers[0](b.norms[0](h), None, 0))
    up = b.mlp.up_proj(b.norms[2](h))
    h = h + b.norms[3](b.mlp.down_proj(F.gelu(up)))
    torch.testing.assert_close(model(ids), head(model, model.final_norm(h)), rtol=1e-12, atol=1e-12)
    ln = lower(SWA, norm="layernorm(eps=1e-5)")
    assert all(isinstance(n, torch.nn.LayerNorm) and n.eps == 1e-5 for n in ln.blocks[0].norms)


def test_mlp_none_drops_the_mlp_half():
    model = lower(call("swa", "mlp=none"))
    b = model.blocks[0]
    assert not hasattr(b, "mlp") and len(b.norms) == 1
    ids = tokens(1, 4)
    h = model.embed(ids)
    h = h + b.mixers[0](b.norms[0](h), None, 0)
    torch.testing.assert_close(model(ids), head(model, model.final_norm(h)), rtol=1e-12, atol=1e-12)


def test_repeat_makes_copies_with_separate_weights():
    model = lower("repeat 2 < full >")
    a, b = (model.blocks[i].mixers[0].q_proj.weight for i in range(2))
    assert a.data_ptr() != b.data_ptr() and not torch.equal(a, b)


def test_untied_head_and_backbone():
    untied = lower(SWA, tie_embeddings="false")
    ids = tokens(1, 4)
    h = untied.final_norm(blk(untied, 0, untied.embed(ids)))
    torch.testing.assert_close(untied(ids), untied.lm_head(h), rtol=1e-12, atol=1e-12)
    backbone = lower(SWA, head="none")
    out = backbone(ids)
    assert out.shape == (1, 4, 32)
    h = backbone.final_norm(blk(backbone, 0, backbone.embed(ids)))
    torch.testing.assert_close(out, h, rtol=1e-12, atol=1e-12)


def test_nested_loops_apply_inner_blocks_T_outer_times_T_inner():
    model = lower(f"loop T=2 < {GDN}; loop T=3 < {SWA} > >")
    assert model.applications == 2 * (1 + 3)
    ids = tokens(2, 8)
    h = model.embed(ids)
    for _ in range(2):
        h = blk(model, 0, h)
        for _ in range(3):
            h = blk(model, 1, h)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), head(model, model.final_norm(h)), rtol=1e-12, atol=1e-12)
        pieces, cache = run_chunks(model, ids, [3, 1, 1, 1, 2])
        torch.testing.assert_close(pieces, model(ids), rtol=1e-9, atol=1e-9)
    assert len(cache.entries) == 8


def test_output_projections_are_scaled_by_depth():
    """GPT-2 init: residual output projections std 0.02 / sqrt(2 · applications)."""
    model = lower(
        "loop T=4 < full(heads=8, head_dim=32); full(heads=8, head_dim=32) >",
        dim=256,
        mlp="swiglu(hidden=512)",
    )
    std = 0.02 / (2 * 8) ** 0.5
    o = torch.cat([model.blocks[i].mixers[0].o_proj.weight.flatten() for i in range(2)])
    down = torch.cat([model.blocks[i].mlp.down_proj.weight.flatten() for i in range(2)])
    q = model.blocks[0].mixers[0].q_proj.weight
    assert abs(o.std().item() / std - 1) < 0.05 and abs(down.std().item() / std - 1) < 0.05
    assert abs(q.std().item() / 0.02 - 1) < 0.05 and abs(model.embed.weight.std().item() / 0.02 - 1) < 0.05
    assert torch.equal(model.blocks[0].norms[0].weight, torch.ones(256, dtype=torch.float64))
