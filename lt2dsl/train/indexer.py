"""The DSA lightning indexer's own loss in training (mixers.md §11(b), DeepSeek-V3.2).

The indexer picks each query's top-k keys; the pick is discrete, so the LM loss gives it no
gradient. `IndexerLoss` adds, for every application of every `dsa` layer, the layer's
`indexer_loss`: KL(p_t ‖ softmax(I[t, :])) between the main attention's probabilities (summed
over heads, L1-normalised, detached) and the index scores, over the indexer's top-k keys (`keys =
"selected"`, V3.2's sparse stage) or over all causal keys (`"all"`, its dense warm-up). The
indexer reads a detached input, so the KL trains only `idx_*` and the LM loss everything else.

The KL enters through a forward hook on each block holding a `dsa` layer: it runs inside the
block's call (so inside FSDP's unit for the block and activation checkpointing; outside a compiled
block's graph, and alike whether the block runs fused or eagerly), reads the layers' input — the
block's first norm of its input, recomputed without gradient — and `AddAux` hangs
`weight / grad_accum · mean_t KL` on the block's output, whose backward sends gradient 1 into it:
whatever loss is backpropagated through the model trains the indexer too. Per optimizer step the
indexer's objective is `weight` × Σ over applications of the mean KL per token (micro-batches and
processes averaged). The values of the training forwards are kept for the metric row
(`indexer_loss`: mean KL per token and application); a recomputation in backward keeps none. A
loss that calls the model's modules itself rather than through `TrainModel.forward` (the
distillation's `align` and `hidden` stages) brackets its forward with `begin()` / `end()` too,
and one that calls a `dsa` mixer outside its block hangs the KL on the mixer's output with `add`.

Under `training.cuda_graph` a replay runs no Python, so no hook appends a value: the step moves its
forwards' values into a device buffer of its own (`take`: their sum and count, captured with the
step), and the trainer hands a copy of that buffer to `record` after every step, eager or replayed.
"""

from __future__ import annotations

import torch
from torch import nn

from lt2dsl.lowering.layers.dsa import SparseAttention


class AddAux(torch.autograd.Function):
    """`out` unchanged; backward also gives the scalar `aux` the gradient 1."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.ones((), dtype=torch.float32, device=grad.device)


def dsa_layers(model: nn.Module) -> list[SparseAttention]:
    return [m for m in model.modules() if isinstance(m, SparseAttention)]


def freeze_indexers(model: nn.Module) -> None:
    """Keep every `idx_*` parameter at its initial value (nothing else trains it)."""
    for layer in dsa_layers(model):
        for name, p in layer.named_parameters():
            if name.startswith("idx_"):
                p.requires_grad_(False)


class IndexerLoss:
    """The hooks on the blocks of a model's `dsa` layers (module docstring). `TrainModel.forward`
    calls `begin()` and `end()` around a forward; `pop()` reads the values of the forwards since
    the last call."""

    def __init__(self, model: nn.Module, weight: float, keys: str, grad_accum: int):
        if keys not in ("selected", "all"):
            raise ValueError(f"indexer_loss_keys must be 'selected' or 'all', got {keys!r}")
        self.scale, self.sparse = weight / grad_accum, keys == "selected"
        # `values`: every value since the last `begin()` (recomputations too); `kept`: the forwards'
        self.values: list[torch.Tensor] = []
        self.kept: list[torch.Tensor] = []
        self.taken: list[torch.Tensor] = []  # `[2]` (sum, count) of steps whose values `take` moved
        self.handles = [
            block.register_forward_hook(self._hook, with_kwargs=True)
            for block in model.blocks
            if dsa_layers(block)
        ]

    def _hook(self, block: nn.Module, args: tuple, kwargs: dict, out: torch.Tensor):
        if not (block.training and torch.is_grad_enabled()):
            return None
        h = args[0]
        pos = args[2] if len(args) > 2 else kwargs.get("pos", 0)
        cu = args[3] if len(args) > 3 else kwargs.get("cu_seqlens")
        with torch.no_grad():
            x = block.norms[0](h)  # what every mixer of the block reads (`ResidualBlock.forward`)
        return self.add(dsa_layers(block), x, pos, cu, out)

    def add(
        self, layers: list[SparseAttention], x: torch.Tensor, pos: int, cu, out: torch.Tensor
    ) -> torch.Tensor:
        """`out` carrying the KL of `layers` on their input `x` `[B, T, D]` (recorded); `out` itself
        when none of them trains. A caller that runs a `dsa` mixer outside its block's call (the
        distillation's `align` stage) hangs the KL on the mixer's output with this."""
        layers = [layer for layer in layers if layer.training and torch.is_grad_enabled()]
        if not layers:
            return out
        total = None
        for layer in layers:
            kl = layer.indexer_loss(x, pos, sparse=self.sparse, reduction="mean", cu_seqlens=cu)
            self.values.append(kl.detach())
            total = kl if total is None else total + kl
        return AddAux.apply(out, total * self.scale)

    def begin(self) -> None:
        """A forward starts: what was recorded since the last one came from recomputations."""
        self.values.clear()

    def end(self) -> None:
        """A forward ended: keep its values."""
        self.kept.extend(self.values)
        self.values.clear()

    def take(self, into: torch.Tensor) -> None:
        """Move the kept values onto the device: `into` `[2]` fp32 gets (their sum, their count)
        and `kept` empties. Nothing waits for the host, so a CUDA graph captures it (the count is
        a constant of the captured step: one value per `dsa` application and micro-batch)."""
        kept, self.kept = self.kept, []
        into.zero_()
        if kept:
            into[0] += torch.stack(kept).sum().float()
            into[1] += float(len(kept))

    def record(self, taken: torch.Tensor) -> None:
        """A step's `take` result (a copy, read at the next `pop`)."""
        self.taken.append(taken)

    def pop(self) -> tuple[float, int]:
        """(sum, count) of the per-application mean KLs of the forwards since the last call."""
        kept, self.kept = self.kept, []
        taken, self.taken = self.taken, []
        total = float(torch.stack(kept).sum()) if kept else 0.0
        n = len(kept)
        if taken:
            s, c = torch.stack(taken).sum(0).tolist()
            total, n = total + s, n + int(c)
        return total, n

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def attach(model: nn.Module, weight: float, keys: str, grad_accum: int) -> IndexerLoss | None:
    """The indexer loss of `model` (None without `dsa` layers); weight 0 freezes the indexers."""
    if not dsa_layers(model):
        return None
    if weight == 0:
        freeze_indexers(model)
        return None
    return IndexerLoss(model, weight, keys, grad_accum)
