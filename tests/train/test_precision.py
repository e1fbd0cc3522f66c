"""bf16 without FSDP (`train/precision.py`): the forward on bf16 copies of fp32 master weights runs
exactly as the same model in bf16, gradients land on the masters, and the trainer's fused blocks
then keep about what the fused lowered module keeps for backward (saved-tensor hooks, CPU; Triton
kernels interpreted), which the estimate's activations count within 2%."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import lt2dsl
from lt2dsl.cost.estimate import block_activations
from lt2dsl.passes.resolve import blocks
from lt2dsl.train.parallel import TrainModel
from lt2dsl.train.precision import ParamCast
from lt2dsl.train.saved import per_token_application, saved_bytes

from .helpers import MODEL

LOOPED = MODEL.format(tied="false")
DIM = 64
GDN = f"""model m {{{{
  dim = {DIM}
  vocab = 256
  tie_embeddings = true
  mlp = swiglu(hidden=128)
  gdn(heads=2, head_dim=32, expand_v=2) * {{n}}
}}}}
"""


def hidden_and_grads(tm: TrainModel, ids: torch.Tensor, autocast: bool = False):
    # the trainer's autocast (for modules beside the model) around the forward, not the backward
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        h = tm(ids)
        loss = (h.float() * torch.linspace(-1, 1, h.shape[-1])).sum()
    loss.backward()
    return h.detach(), {n: p.grad for n, p in tm.named_parameters()}


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_bf16_copies_run_exactly_as_the_model_in_bf16(checkpointed):
    torch.manual_seed(0)
    master = lt2dsl.compile(LOOPED, backend="reference", dtype=torch.float32, fuse=False)
    narrow = copy.deepcopy(master).to(torch.bfloat16)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    tm = TrainModel(master, checkpointed)
    tm.cast = ParamCast(tm, torch.bfloat16)
    got, grads = hidden_and_grads(tm, ids, autocast=True)
    want, want_grads = hidden_and_grads(TrainModel(narrow, checkpointed), ids)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert sum(g is not None for g in grads.values()) > 10
    for name, g in grads.items():
        if g is None:  # the head (h is the output here) and the DSA indexer (no gradient)
            assert want_grads[name] is None, name
            continue
        assert g.dtype == torch.float32, name  # the masters' gradients
        assert torch.equal(g, want_grads[name].float()), name
    # between forwards every module holds its fp32 master Parameters again
    assert all(type(p) is nn.Parameter and p.dtype == torch.float32 for p in master.parameters())
    assert sum(1 for _ in master.parameters()) == len(grads)


def per_application(way: str) -> float:
    """Saved bytes per token per GDN block application of one way to run the model."""

    def saved(n: int, T: int) -> int:
        torch.manual_seed(0)
        narrow = way == "lowered module"
        model = lt2dsl.compile(
            GDN.format(n=n), backend="triton", dtype=torch.bfloat16 if narrow else torch.float32
        )
        ids = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(1))
        if narrow:
            return saved_bytes(lambda: model(ids))
        tm = TrainModel(model, fuse=way == "trainer fused")
        tm.cast = ParamCast(tm, torch.bfloat16)
        return saved_bytes(lambda: tm(ids))

    return per_token_application(saved)


def test_fused_blocks_keep_what_the_lowered_module_keeps():
    lowered = per_application("lowered module")
    fused = per_application("trainer fused")
    ir = lt2dsl.lowering.resolve_source(GDN.format(n=1), {})
    estimate = 2 * block_activations(blocks(ir.body)[0][0], ir.config)
    print(f"bytes per token and application: lowered {lowered:.0f}, fused {fused:.0f}, estimate {estimate}")
    # one difference: the block's first RMSNorm stands alone where the whole model's graph fuses it
    # with the previous block's residual add; the CPU's composite norm keeps x and x·rstd in fp32
    # (8 bytes per channel) where the fused add-norm (and CUDA's rms_norm) keeps one bf16 input (2).
    # The eager blocks keep about twice as much (8136 bytes here).
    assert lowered <= fused <= lowered + 6 * DIM
    # the estimate counts what the fused kernels keep (tests/cost/test_activations.py: every kind)
    assert abs(estimate - lowered) <= 0.02 * lowered
    assert abs(estimate + 6 * DIM - fused) <= 0.02 * fused


# every mixer kind once: a fused block is traced on the fp32 masters and run on bf16 copies, so a
# dtype read from the parameters at trace time would stay fp32 (`linear`'s normalised output did)
KINDS = ["linear", "mlstm", "gdn", "deltanet", "kda", "gla", "retnet", "mamba2", "full", "swa(window=8)"]
KINDS += ["dsa(topk=4)", "nsa", "tmm(max_len=32)"]


@pytest.mark.parametrize("kind", KINDS)
def test_fused_blocks_run_on_bf16_copies_as_the_model_in_bf16(kind):
    torch.manual_seed(0)
    src = "model m {\n  dim = 64\n  vocab = 256\n  loop T=2 < " + kind + " >\n}"
    master = lt2dsl.compile(src, backend="reference", dtype=torch.float32)
    narrow = copy.deepcopy(master).to(torch.bfloat16)
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    tm = TrainModel(master, fuse=True)
    tm.cast = ParamCast(tm, torch.bfloat16)
    got, grads = hidden_and_grads(tm, ids)
    want, _ = hidden_and_grads(TrainModel(narrow, fuse=True), ids)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert all(g is None or torch.isfinite(g).all() for g in grads.values())
