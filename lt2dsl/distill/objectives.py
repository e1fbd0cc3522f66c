"""The stages' objectives: what each distillation stage minimises, as trainer objectives.

Each is a `lt2dsl.train.objective.Objective`: `prepare(model)` gives the freshly built student its
starting weights (from the teacher, `init.py`, or the previous stage's) and freezes what the stage
does not train; `loss_module(...)` is the loss the trainer calls per micro-batch, summed over the
labelled tokens. The teacher runs frozen, in eval mode, without gradients.

* `align` (LT2's pre-linear alignment; the linearisation study's stage 1): the teacher runs, and
  beside each of its mixers that the student replaces, the student's mixer runs on the same input
  (the teacher's own residual stream, normed). The teacher's output goes on, so later layers see
  teacher activations; the loss is mean ‖t − s‖ · D^-½ over tokens and mixer applications
  (hybrid-distillation's `AttentionDistillationWrapper`). Only the replaced mixers train.
* `hidden` (the study's stage 2): the same with whole blocks: the student's block on the teacher's
  block input against the teacher's block output.

A `dsa` mixer's lightning indexer gets no gradient from either distance (its top-k pick is
discrete); it is a mixer parameter, and what trains it is its KL to the main attention it
approximates (`train/indexer.py`; DeepSeek-V3.2's warm-up trains the indexer alone by that KL). So
in `align` and `hidden`, as in `kd`, every training application of a student `dsa` mixer adds its
`indexer_loss` to the stage's objective and to the logged `indexer_loss`: the block's hook fires when
`hidden` calls the student's block, and `align`, calling the mixer alone, hangs the KL on the
mixer's output itself (`IndexerLoss.add`).
* `kd` (LT2's stage 2, the study's stage 3): KL to the teacher's logits plus next-token loss
  (`kl.linear_kd_loss`, chunked), every parameter; with `kl_weight = 0` the teacher does not run
  (the `long` stage's default: plain next-token training).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from lt2dsl.distill.init import init_student
from lt2dsl.distill.kl import linear_kd_loss
from lt2dsl.distill.lineup import Pair, line_up
from lt2dsl.lowering.layers.dsa import SparseAttention
from lt2dsl.train.loss import IGNORE, label_hits, linear_cross_entropy
from lt2dsl.train.parallel import TrainModel

Trainable = Literal["mixers", "blocks", "all"]
# A tiny floor under the squared distance keeps the norm's gradient finite where t == s.
NORM_FLOOR = 1e-12


@dataclass
class KdTerms:
    """The weights of the `kd` loss: kl_weight · τ² · KL + ce_weight · CE."""

    kl_weight: float = 1.0
    ce_weight: float = 1.0
    temperature: float = 1.0


class StageObjective:
    """A stage's objective (module docstring); `model` is the student once `prepare` has run."""

    # outputs' error (align, hidden) or KL mixed with cross-entropy (kd): exp of either is no perplexity
    perplexity = False

    def __init__(
        self,
        kind: str,
        teacher: nn.Module,
        trainable: Trainable,
        weights: dict[str, torch.Tensor] | None = None,
        terms: KdTerms | None = None,
    ):
        self.kind, self.teacher, self.trainable = kind, teacher, trainable
        self.weights, self.terms = weights, terms or KdTerms()
        self.model: nn.Module | None = None
        self.pairs: list[Pair] = []

    def prepare(self, model: nn.Module) -> None:
        """Start `model` from the teacher (no `weights`) or from `weights`, then freeze."""
        self.pairs = line_up(self.teacher.ir, model.ir)
        if self.weights is None:
            init_student(self.teacher, model)
        else:
            model.load_state_dict(self.weights, strict=True)
        freeze(model, self.pairs, self.trainable)
        self.model = model

    def loss_module(self, tm: TrainModel, chunk: int, dtype: torch.dtype) -> nn.Module:
        teacher = frozen_teacher(self.teacher, next(tm.parameters()).device)
        converted = [p.index for p in self.pairs if p.converted]
        if self.kind == "align":
            return MatchOutputs(teacher, tm, converted, lambda m: m.mixers[0], "mixers")
        if self.kind == "hidden":
            return MatchOutputs(teacher, tm, converted, lambda m: m, "blocks")
        return KdLoss(teacher, tm, chunk, dtype, self.terms)


def freeze(model: nn.Module, pairs: list[Pair], trainable: Trainable) -> None:
    """`requires_grad` on exactly the parameters a stage trains: the replaced mixers (`mixers`),
    the blocks holding them (`blocks`) or everything (`all`)."""
    converted = {p.index for p in pairs if p.converted}
    for name, p in model.named_parameters():
        parts = name.split(".")
        in_block = parts[0] == "blocks" and int(parts[1]) in converted
        wanted = {
            "all": True,
            "blocks": in_block,
            "mixers": in_block and parts[2] == "mixers",
        }[trainable]
        p.requires_grad_(wanted)


def frozen_teacher(teacher: nn.Module, device: torch.device) -> TrainModel:
    """The teacher's training forward (final hidden states), frozen, in eval mode, on `device`."""
    teacher.requires_grad_(False)
    tm = TrainModel(teacher.to(device))
    return tm.eval()


def rms_error(t: torch.Tensor, s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ over the masked tokens of ‖t − s‖₂ · D^-½ (fp32): t, s `[B, T, D]`, mask `[B, T]`."""
    d = (t.float() - s.float())[mask]
    return ((d.pow(2).sum(-1) + NORM_FLOOR).sqrt() * d.shape[-1] ** -0.5).sum()


class MatchOutputs(nn.Module):
    """`align` / `hidden`: the teacher's forward with, beside each chosen module of its converted
    blocks (`pick(block)`: the mixer, or the block itself), the student's same module on the same
    input; returns Σ over labelled tokens of the mean over applications of `rms_error`."""

    def __init__(
        self,
        teacher: TrainModel,
        student: TrainModel,
        blocks: list[int],
        pick: Callable[[nn.Module], nn.Module],
        what: str,
    ):
        super().__init__()
        if not blocks:
            raise ValueError(f"the student replaces no teacher mixer: there are no {what} to align")
        self.teacher, self.student, self.blocks, self.pick = teacher, student, blocks, pick

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, cu_seqlens=None) -> torch.Tensor:
        mask, terms = labels != IGNORE, []
        indexer = self.student.indexer  # the DSA indexers' KL (`train/indexer.py`), None without

        def beside(student_module: nn.Module):
            def hook(module, args, out):
                x, _entry, pos, cu = args  # a block or mixer call: (input, cache entry, pos, cu_seqlens)
                with torch.enable_grad():  # the teacher runs without gradients; its neighbour trains
                    s = student_module(x.detach(), None, pos, cu)
                    if indexer is not None and isinstance(student_module, SparseAttention):
                        # a mixer called alone: no block hook runs; x is what it reads
                        s = indexer.add([student_module], x.detach(), pos, cu, s)
                    terms.append(rms_error(out.detach(), s, mask))

            return hook

        handles = [
            self.pick(self.teacher.blocks[i]).register_forward_hook(beside(self.pick(self.student.blocks[i])))
            for i in self.blocks
        ]
        if indexer is not None:
            indexer.begin()
        try:
            with torch.no_grad():
                self.teacher(input_ids, None, cu_seqlens)
        finally:
            for h in handles:
                h.remove()
        if indexer is not None:
            indexer.end()
        return torch.stack(terms).mean()


class KdLoss(nn.Module):
    """`kd`: the student's forward and the teacher's, then the chunked KL + CE (`kl.py`). With
    `hits=True` (a task source that observes) it returns (loss, labelled tokens the student's
    argmax predicts right), as the trainer's `WithLoss`."""

    def __init__(
        self, teacher: TrainModel, student: TrainModel, chunk: int, dtype: torch.dtype, terms: KdTerms
    ):
        super().__init__()
        self.teacher, self.tm, self.chunk, self.dtype, self.terms = teacher, student, chunk, dtype, terms

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, cu_seqlens=None, hits: bool = False):
        h = self.tm(input_ids, None, cu_seqlens)
        w = self.tm.head_weight()
        loss = self._loss(input_ids, labels, cu_seqlens, h, w)
        if not hits:
            return loss
        return loss, label_hits(h.detach(), w.detach(), labels, self.chunk, self.dtype)

    def _loss(self, input_ids, labels, cu_seqlens, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        terms = self.terms
        if not terms.kl_weight:
            return terms.ce_weight * linear_cross_entropy(h, w, labels, self.chunk, self.dtype)
        with torch.no_grad():
            th = self.teacher(input_ids, None, cu_seqlens)
        return linear_kd_loss(
            h,
            w,
            th,
            self.teacher.head_weight(),
            labels,
            kl_weight=terms.kl_weight,
            ce_weight=terms.ce_weight,
            temperature=terms.temperature,
            chunk=self.chunk,
            dtype=self.dtype,
        )
