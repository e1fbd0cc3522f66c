"""Training memory per process: weights, gradients, AdamW state, activations, the loss buffers.

Symbols: N stored parameters, P processes, B rows of L tokens per micro-batch, D width, V vocabulary,
C the loss chunk (tokens), b the activation bytes (2 for bf16).

    weights     4N / P      fp32 master weights (sharded by FSDP)
    grads       4N / P      fp32 gradients
    optimizer   8N / P      AdamW's two fp32 moments
    copies      2N          bf16 weight copies: autocast's cast cache of a single process holds
                            them all; under FSDP (P > 1) the gathered units in flight, counted as
                            the two largest blocks plus the embedding, head and norms
    activations B·L·(Σ_apps a_app)·b              every block application keeps its elements
                B·L·(apps·D + Σ_apps k_app + max_app a_app)·b
                                                  with per-application checkpointing: every
                                                  application's input and kept attention outputs
                                                  k_app (none with `keep_attention=False`), plus
                                                  one recomputed whole
    loss        8·C·V + 4·V·D + b·B·L·D           one chunk's fp32 logits and their gradient, the
                                                  head gradient the chunked loss keeps, the hidden-state
                                                  gradient (`lt2dsl.train.loss`)

16 bytes per parameter for mixed-precision AdamW, divided by P under full sharding, is ZeRO's
count (Rajbhandari et al. 2020, §3.1 and §5: "16Ψ", stage 3 divides it by N_d). The activation
elements per application a_app are `cost.estimate.block_activations`, k_app `block_kept` — the estimate's
`train_activations_bytes` / `train_activations_recompute_bytes` without their full-logits term,
which the chunked loss replaces.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lt2dsl.cost.estimate import block_activations, block_kept, block_params, extra_weights
from lt2dsl.dtypes import nbytes
from lt2dsl.ir import nodes as n
from lt2dsl.passes.resolve import blocks as iter_blocks


@dataclass(frozen=True)
class TrainMemory:
    """Bytes per process (module docstring); `total(checkpointed)` sums them."""

    weights: int
    grads: int
    optimizer: int
    copies: int
    activations: int
    activations_checkpointed: int
    loss: int

    def total(self, checkpointed: bool) -> int:
        act = self.activations_checkpointed if checkpointed else self.activations
        return self.weights + self.grads + self.optimizer + self.copies + act + self.loss

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total(False), "total_checkpointed": self.total(True)}


def train_memory(
    model: n.Model,
    batch: int,
    seq: int,
    processes: int = 1,
    loss_chunk: int = 4096,
    act_dtype: str = "bf16",
    keep_attention: bool = True,
) -> TrainMemory:
    """The training memory of `model` for micro-batches of `batch` rows of `seq` tokens;
    `keep_attention`: checkpointing keeps the attention outputs (`training.checkpoint_keep`)."""
    cfg = model.config
    placed = iter_blocks(model.body)
    blocks = [block_params(b, cfg) for b, _ in placed]
    extras = sum(_numel(s) for s in extra_weights(model).values())
    N = sum(blocks) + extras
    b = nbytes(act_dtype)
    tokens = batch * seq
    apps = sum(it for _, it in placed)
    per_app = [block_activations(blk, cfg) for blk, _ in placed]
    full = tokens * sum(a * it for a, (_, it) in zip(per_app, placed)) * b
    kept = sum(block_kept(blk, cfg) * it for blk, it in placed) if keep_attention else 0
    recompute = tokens * (apps * cfg.dim + kept + max(per_app, default=0)) * b
    head = cfg.vocab * cfg.dim if cfg.head else 0
    loss = (8 * min(loss_chunk, tokens) * cfg.vocab + 4 * head + b * tokens * cfg.dim) if cfg.head else 0
    gathered = N if processes == 1 else min(N, sum(sorted(blocks)[-2:]) + extras)
    return TrainMemory(
        weights=4 * N // processes,
        grads=4 * N // processes,
        optimizer=8 * N // processes,
        copies=2 * gathered if b == 2 else 0,
        activations=full,
        activations_checkpointed=recompute,
        loss=loss,
    )


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out
