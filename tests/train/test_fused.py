"""The trainer's fused blocks (`train/fused.py`): the lowering's fused graph of each block, run as
the block's forward, gives the eager blocks' losses and gradients (fp32, CPU) — with activation
checkpointing, packed rows (`cu_seqlens`) and the DSA indexer's loss — and leaves the model's own
graph, copies and the unfused path as they were."""

from __future__ import annotations

import copy

import pytest
import torch

import lt2dsl
from lt2dsl.lowering.blocks import ResidualBlock
from lt2dsl.train import indexer
from lt2dsl.train.fused import FusedBlock, fuse_blocks
from lt2dsl.train.loss import linear_cross_entropy
from lt2dsl.train.parallel import TrainModel

from ..lowering.util import KINDS, call
from .helpers import MODEL

HEAD = "  dim = 32\n  vocab = 64\n  heads = 2\n  head_dim = 16\n  mlp = swiglu(hidden=64)\n"
MODELS = {
    "gdn": f"model m {{\n{HEAD}  gdn(expand_v=1) * 2\n}}\n",
    "gdn_dsa_looped": MODEL.format(tied="false").replace("vocab = 256", "vocab = 64"),
    "full": f"model m {{\n{HEAD}  full(qk_norm=true) * 2\n}}\n",
}
# what the fusion passes rewrite in one GDN block (norm_proj: the mixer's projections, the MLP's)
GDN_RULES = {
    "gdn_gate": 1,
    "conv_silu_l2norm": 1,
    "gated_norm_proj": 1,
    "swiglu": 1,
    "add_rmsnorm": 1,
    "norm_proj": 2,
}
CU = torch.tensor([0, 9, 20, 32], dtype=torch.int32)


def loss_and_grads(src: str, fuse: bool, checkpointed: bool, packed: bool, kl: bool = False):
    torch.manual_seed(0)
    model = lt2dsl.compile(src, backend="reference", dtype=torch.float32, fuse=False)
    tm = TrainModel(model, checkpointed, fuse=fuse)
    if kl:
        tm.indexer = indexer.attach(model, 1.0, "selected", grad_accum=1)
    ids = torch.randint(0, 64, (1, 32) if packed else (2, 16), generator=torch.Generator().manual_seed(1))
    loss = linear_cross_entropy(tm(ids, None, CU if packed else None), tm.head_weight(), ids.roll(-1, 1))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def assert_same(a, b) -> None:
    (la, ga), (lb, gb) = a, b
    torch.testing.assert_close(la, lb, rtol=1e-6, atol=1e-6)
    assert ga.keys() == gb.keys()
    for name in ga:
        assert (ga[name] is None) == (gb[name] is None), name
        if ga[name] is not None:
            torch.testing.assert_close(ga[name], gb[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("packed", [False, True], ids=["rows", "cu_seqlens"])
@pytest.mark.parametrize("name", list(MODELS))
def test_fused_blocks_give_the_eager_losses_and_gradients(name, packed, checkpointed):
    src = MODELS[name]
    kl = "dsa" in src  # the indexer's KL hangs on the block's output either way
    eager = loss_and_grads(src, False, checkpointed, packed, kl)
    assert_same(loss_and_grads(src, True, checkpointed, packed, kl), eager)


def test_the_rules_fire_in_every_block():
    model = lt2dsl.compile(MODELS["gdn"], backend="reference", dtype=torch.float32, fuse=False)
    fired = fuse_blocks(model.blocks)
    assert all(fired[r] == 2 * n for r, n in GDN_RULES.items()), fired  # two blocks
    assert all(type(b) is FusedBlock for b in model.blocks)


@pytest.mark.parametrize("kind", KINDS)
def test_every_mixer_kind_runs_fused_as_eager(kind):
    src = f"model m {{\n{HEAD}  {call(kind)}\n}}\n"
    torch.manual_seed(0)
    block = lt2dsl.compile(src, backend="reference", dtype=torch.float32, fuse=False).blocks[0]
    h = torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(2), requires_grad=True)
    w = torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)

    def run(c):
        out = block(h, None, 0, c)
        grads = torch.autograd.grad((out * w).sum(), [h, *block.parameters()], allow_unused=True)
        return out.detach(), grads

    want = [run(None), run(cu)]
    fuse_blocks(torch.nn.ModuleList([block]))
    for (out, grads), (want_out, want_grads) in zip([run(None), run(cu)], want):
        torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)
        for g, wg, p in zip(grads, want_grads, [h, *block.parameters()]):
            # a concatenated projection gives the DSA indexer's weights zeros where eager gives None
            g, wg = (torch.zeros_like(p) if x is None else x for x in (g, wg))
            torch.testing.assert_close(g, wg, rtol=1e-5, atol=1e-5)


def test_the_model_graph_copies_and_the_eager_path_stay_as_they_were():
    torch.manual_seed(0)
    model = lt2dsl.compile(MODELS["gdn"], backend="reference", dtype=torch.float32, fuse=False)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids)
        TrainModel(model, fuse=True)
        model.rebuild_graph()  # the LT2Model traces its fused blocks as lowering wrote them
        torch.testing.assert_close(model(ids), before, rtol=0, atol=0)
        twin = copy.deepcopy(model)  # the copy's fused code runs on the copy's weights
        twin.blocks[0].mlp.down_proj.weight.mul_(2)
        h = torch.randn(1, 8, 32)
        assert not torch.equal(twin.blocks[0](h), model.blocks[0](h))
        twin.blocks[0].mlp.down_proj.weight.div_(2)
        torch.testing.assert_close(twin.blocks[0](h), model.blocks[0](h), rtol=0, atol=0)
    TrainModel(model, fuse=False)  # a mixer's forward hook needs the blocks eager again
    assert all(type(b) is ResidualBlock for b in model.blocks)
    seen = []
    model.blocks[0].mixers[0].register_forward_hook(lambda m, a, o: seen.append(o))
    TrainModel(model)(ids)
    assert len(seen) == 1
