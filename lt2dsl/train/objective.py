"""What a step minimises: the trainer's objective hook.

The trainer's own objective is the language-model loss (`LMObjective`: next-token cross-entropy
from the final hidden states, `parallel.WithLoss`). A room that trains with another loss
(`lt2dsl/distill`) passes its own to `run(cfg, objective=...)` rather than copying the loop: the
trainer still reads the data, steps the optimizer and the schedule, logs, evaluates and
checkpoints, and the objective decides two things:

* `prepare(model)`: called on the freshly built `LT2Model` (fp32, on the CPU, initialised under the
  run's seed) before it moves to the device and the optimizer is made — load weights, and freeze
  what must not train (`requires_grad_(False)`: the optimizer takes only parameters that need a
  gradient; checkpoints still hold every parameter);
* `loss_module(tm, chunk, dtype)`: the module `(input_ids, labels, cu_seqlens) → loss summed over
  the labelled tokens` that the trainer calls for every micro-batch and held-out batch (it divides
  by the labelled-token count itself). `tm` is the training forward (`TrainModel`, returning the
  final hidden states), `chunk` the loss chunk in tokens, `dtype` the logits' matmul dtype.

Its attribute `perplexity` says whether that loss is the next-token cross-entropy, so that
exp(held-out loss) is a perplexity the metrics report (an alignment's MSE or a KL mix is not).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from lt2dsl.train.parallel import TrainModel, WithLoss


class Objective(Protocol):
    perplexity: bool

    def prepare(self, model: nn.Module) -> None: ...

    def loss_module(self, tm: TrainModel, chunk: int, dtype: torch.dtype) -> nn.Module: ...


class LMObjective:
    """Next-token cross-entropy over every parameter: the trainer's default."""

    perplexity = True

    def prepare(self, model: nn.Module) -> None:
        """Nothing to load or freeze."""

    def loss_module(self, tm: TrainModel, chunk: int, dtype: torch.dtype) -> nn.Module:
        return WithLoss(tm, chunk, dtype)
