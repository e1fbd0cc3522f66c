"""The DSA indexer's KL loss in training: it alone trains `idx_*` (the main weights' gradients are
the LM loss's, with or without activation checkpointing), the indexer learns on a toy run, and
weight 0 freezes the indexers, so every trained parameter has optimizer state (strict resume)."""

from __future__ import annotations

import pytest
import torch

import lt2dsl
from lt2dsl.train import indexer, run
from lt2dsl.train.loss import linear_cross_entropy
from lt2dsl.train.parallel import TrainModel

from .helpers import TEXT, config

# qk_norm: the main attention's logits are O(1) from the start, so its distribution is not flat
DSA = """model m {
  dim = 32
  vocab = 256
  heads = 2
  head_dim = 16
  mlp = swiglu(hidden=64)
  loop T=2 < dsa(topk=8, index_heads=2, index_dim=8, qk_norm=true) >
}
"""


def grads(weight: float, checkpointed: bool, keys: str = "selected") -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = lt2dsl.compile(DSA, backend="reference", dtype=torch.float64, fuse=False)
    tm = TrainModel(model, checkpointed)
    tm.indexer = indexer.attach(model, weight, keys, grad_accum=2)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(ids, -1, 1)
    linear_cross_entropy(tm(ids), tm.head_weight(), labels).backward()
    if tm.indexer is not None:
        assert tm.indexer.pop()[1] == 2  # one value per application of the looped layer
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("keys", ["selected", "all"])
def test_the_kl_trains_the_indexer_alone(keys):
    plain = grads(1.0, False, keys)
    checkpointed = grads(1.0, True, keys)
    lm_only = grads(0.0, False)
    idx = [n for n in plain if ".idx_" in n]
    assert len(idx) == 5  # idx_q, idx_k, idx_k_norm (weight, bias), idx_w
    for name, g in plain.items():
        if name in idx:
            assert g is not None and g.abs().max() > 0, name
            assert lm_only[name] is None  # frozen without the KL: nothing else trains it
        else:
            torch.testing.assert_close(g, lm_only[name], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(checkpointed[name], g, rtol=1e-10, atol=1e-14)
    half = grads(0.5, False, keys)  # the weight scales the indexer's gradient only
    for name in idx:
        torch.testing.assert_close(half[name], 0.5 * plain[name], rtol=1e-10, atol=1e-14)


# the dense warm-up of DeepSeek-V3.2: the main model frozen, the indexer trained on all causal keys
MAIN = ["embed.*", "final_norm.*", "blocks.*.mlp.*", "blocks.*.norms.*", "blocks.*.mixers.*.[qkvo]_*"]


def held_out_kl(model) -> torch.Tensor:
    """The indexer's KL on fixed rows, from the layer's inputs in a forward of `model`."""
    seen = []
    layer = indexer.dsa_layers(model)[0]
    hook = layer.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    ids = torch.tensor(list(TEXT.read_bytes()[-4 * 32 :])).reshape(4, 32)  # in the held-out split
    with torch.no_grad():
        TrainModel(model)(ids)
    hook.remove()
    return sum(layer.indexer_loss(x, reduction="mean") for x in seen).detach()


def test_the_indexer_learns_on_a_toy_run(tmp_path):
    (tmp_path / "dsa.lt2").write_text(DSA)
    cfg = config(
        tmp_path,
        "warmup",
        training={"steps": 30, "batch_size": 4, "indexer_loss_keys": "all"},
        optimizer={"lr": 1e-2},
        metrics={"log_interval": 5},
    )
    cfg["model"].update(file=str(tmp_path / "dsa.lt2"), freeze=MAIN)
    result = run(cfg)
    curve = [r["indexer_loss"] for r in result.rows if "loss" in r]
    torch.manual_seed(0)  # the run's seed: the same initial weights
    init = lt2dsl.compile(tmp_path / "dsa.lt2", backend="reference", dtype=torch.float32, fuse=False)
    main = [n for n, _ in init.named_parameters() if ".idx_" not in n]
    assert all(torch.equal(init.get_parameter(n), result.model.get_parameter(n)) for n in main)
    before, after = held_out_kl(init), held_out_kl(result.model)
    assert after < 0.8 * before, (before, after)
    assert curve[-1] < curve[0]


def test_weight_zero_freezes_the_indexers_and_resume_is_strict(tmp_path):
    cfg = config(
        tmp_path,
        "off",
        training={"steps": 4, "indexer_loss": 0.0},
        checkpoint={"enable": True, "interval": 2},
    )
    whole = run(cfg)
    assert all(not p.requires_grad for n, p in whole.model.named_parameters() if ".idx_" in n)
    assert not any("indexer_loss" in r for r in whole.rows)
    resumed = run(cfg, resume=tmp_path / "off" / "checkpoints" / "step-000002")
    assert resumed.losses[3] == whole.losses[3] and resumed.losses[4] == whole.losses[4]
