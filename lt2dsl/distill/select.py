"""KL-guided layer selection: which replaced layers stay softmax attention in the hybrid student.

For each block whose mixer the student replaces, `rank_layers` measures the increase in the model's
output KL when that block alone uses the student's (aligned) mixer: the teacher runs with only that
block's mixer output swapped for the student mixer's on the same input, and KL(teacher ‖ swapped)
is averaged over held-out tokens (the teacher against itself is 0, so the KL is the increase).
`choose` keeps the given fraction with the largest increase (or, as the ablation baseline, a seeded
random draw of as many); `hybrid_program` writes those blocks back into the student's `.lt2` as the
teacher's attention call, and `hybrid_state` starts them from the teacher's weights while every
other block keeps the student's.
"""

from __future__ import annotations

import random

import torch
from torch import nn

from lt2dsl.distill.evaluate import CHUNK
from lt2dsl.distill.kl import linear_kd_loss
from lt2dsl.distill.lineup import Pair
from lt2dsl.distill.rewrite import mixer_call, replace_blocks
from lt2dsl.ir import nodes as n
from lt2dsl.train.loader import IGNORE, Batch
from lt2dsl.train.parallel import TrainModel


@torch.no_grad()
def rank_layers(
    teacher: TrainModel, student: TrainModel, pairs: list[Pair], batches: list[Batch]
) -> dict[int, float]:
    """Block index → mean KL (nats per labelled token) of the teacher with that block's mixer
    alone replaced by the student's, for every converted block."""
    teacher.eval()
    device = next(teacher.parameters()).device
    batches = [b.to(device) for b in batches]
    reference = [teacher(b.input_ids, None, b.cu_seqlens) for b in batches]
    count = sum(int((b.labels != IGNORE).sum()) for b in batches)
    scores = {}
    for p in (p for p in pairs if p.converted):
        student_mixer = student.blocks[p.index].mixers[0]
        swap = (
            teacher.blocks[p.index]
            .mixers[0]
            .register_forward_hook(
                lambda _m, args, _out, mixer=student_mixer: mixer(args[0], None, args[2], args[3])
            )
        )
        try:
            total = sum(float(_kl(teacher, ref, b)) for ref, b in zip(reference, batches))
        finally:
            swap.remove()
        scores[p.index] = total / max(count, 1)
    return scores


def _kl(teacher: TrainModel, reference: torch.Tensor, b: Batch) -> torch.Tensor:
    h = teacher(b.input_ids, None, b.cu_seqlens)
    w = teacher.head_weight()
    return linear_kd_loss(h, w, reference, w, b.labels, ce_weight=0.0, chunk=CHUNK)


def keep_count(candidates: int, fraction: float) -> int:
    """How many of `candidates` layers a fraction keeps: rounded half up, at least one when the
    fraction is positive."""
    if fraction <= 0:
        return 0
    return min(candidates, max(1, int(candidates * fraction + 0.5)))


def choose(scores: dict[int, float], fraction: float, method: str = "kl", seed: int = 0) -> list[int]:
    """The blocks to keep as attention: the `fraction` with the largest KL increase (`kl`), or as
    many drawn at random with `seed` (`random`), in block order."""
    k = keep_count(len(scores), fraction)
    if method == "random":
        return sorted(random.Random(seed).sample(sorted(scores), k))
    if method != "kl":
        raise ValueError(f"selection method must be `kl` or `random`, got {method!r}")
    ranked = sorted(scores, key=lambda i: (-scores[i], i))
    return sorted(ranked[:k])


def hybrid_program(
    student_program: n.Program, pairs: list[Pair], chosen: list[int], cfg: n.ModelConfig
) -> n.Program:
    """The student's program with the `chosen` blocks written as their teacher's attention call
    (`cfg`: the student's resolved settings, for the options' defaults)."""
    calls = {pairs[i].student.id: mixer_call(pairs[i].teacher.mixers[0], cfg) for i in chosen}
    out = replace_blocks(student_program, calls)
    total = sum(p.converted for p in pairs)
    kinds = ", ".join(sorted({pairs[i].teacher.mixers[0].type for i in chosen})) or "none"
    note = f"# lt2dsl distill kept {len(chosen)} of {total} distilled blocks as teacher attention ({kinds})"
    return out.model_copy(update={"header": (*student_program.header, note)})


def hybrid_state(
    hybrid: nn.Module, student: dict[str, torch.Tensor], teacher: dict[str, torch.Tensor], chosen: list[int]
) -> dict[str, torch.Tensor]:
    """The hybrid's weights: the chosen blocks' mixers from the teacher, the rest from the student.

    Raises:
        AssertionError: a name or shape of the hybrid is in neither (an internal error).
    """
    keep = {f"blocks.{i}.mixers." for i in chosen}
    state = {}
    for name, p in hybrid.state_dict().items():
        src = teacher if any(name.startswith(k) for k in keep) else student
        t = src.get(name)
        if t is None or t.shape != p.shape:
            raise AssertionError(f"internal error in `hybrid_state`: `{name}` has no source of its shape")
        state[name] = t
    return state
