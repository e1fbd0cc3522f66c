"""Layer selection: the KL ranking, the choice, and the hybrid program written back as `.lt2`."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.distill.init import init_student
from lt2dsl.distill.lineup import line_up
from lt2dsl.distill.rewrite import mixer_call, replace_blocks
from lt2dsl.distill.select import choose, hybrid_program, hybrid_state, keep_count, rank_layers
from lt2dsl.frontend import load_or_raise
from lt2dsl.ir.printer import inline, print_program
from lt2dsl.passes.resolve import blocks
from lt2dsl.train.loader import Batch
from lt2dsl.train.parallel import TrainModel

from .helpers import HEAD, compiled

STUDENT = HEAD.format(
    name="s",
    body="""
  let g = gdn(expand_v=1)

  loop T=2 <
    g * 3  # three
    repeat 2 < g; gdn(expand_v=1, mlp=swiglu(hidden=64)) >
  >""",
)
TEACHER = HEAD.format(name="t", body="loop T=2 < full(rope_theta=500000.0) * 7 >")


def kinds(text: str) -> list[str]:
    return [b.mixers[0].type for b, _ in blocks(load_or_raise(text).model.body)]


@pytest.mark.parametrize(
    ("chosen", "body"),
    [
        ([1], "g; full(rope_theta=500000.0); g; repeat 2 < g; gdn(expand_v=1, mlp=swiglu(hidden=64)) >"),
        (
            [0, 6],
            "full(rope_theta=500000.0); g * 2; g; gdn(expand_v=1, mlp=swiglu(hidden=64)); g; "
            "full(rope_theta=500000.0, mlp=swiglu(hidden=64))",
        ),
    ],
)
def test_chosen_blocks_are_written_back_and_every_other_block_stays(chosen, body):
    t, s = load_or_raise(TEACHER).model, load_or_raise(STUDENT)
    pairs = line_up(t, s.model)
    text = print_program(hybrid_program(s.program, pairs, chosen, s.model.config))
    loop = text.split("loop T=2 <", 1)[1].split(">\n}", 1)[0]
    assert "; ".join(line.split("#")[0].strip() for line in loop.strip().splitlines()) == body
    want = ["full" if i in chosen else "gdn" for i in range(7)]
    assert kinds(text) == want
    hybrid = load_or_raise(text).model
    full = [b for b, _ in blocks(hybrid.body) if b.mixers[0].type == "full"]
    assert all(b.mixers[0].opts == t.body[0].body[0].mixers[0].opts for b in full)
    assert text.startswith(f"# lt2dsl distill kept {len(chosen)} of 7 distilled blocks")


def test_mixer_call_is_the_shortest_call_and_a_bad_id_is_refused():
    m = load_or_raise(TEACHER).model
    mixer = m.body[0].body[0].mixers[0]
    assert inline(mixer_call(mixer, m.config)) == "full(rope_theta=500000.0)"
    with pytest.raises(ValueError, match="no block of the program has the id"):
        replace_blocks(load_or_raise(STUDENT).program, {"loop0/9:gdn": mixer_call(mixer, m.config)})


def test_keep_count_and_choose():
    assert [keep_count(n, 0.25) for n in (1, 2, 4, 6, 8, 16)] == [1, 1, 1, 2, 2, 4]
    assert keep_count(4, 0.0) == 0 and keep_count(3, 1.0) == 3
    scores = {0: 0.1, 1: 0.5, 2: 0.3, 3: 0.5, 4: 0.0, 5: 0.2, 6: 0.0, 7: 0.0}
    assert choose(scores, 0.25) == [1, 3]
    assert choose(scores, 0.25, "random", 0) == choose(scores, 0.25, "random", 0) == [6, 7]
    assert choose(scores, 0.25, "random", 1) == [2, 4]


def test_rank_layers_measures_the_swap_of_each_layer_alone():
    """A window of 64 keys over 24-token rows is full attention: swapping it changes nothing,
    while the one-key window of block 2 does; only block 2 is kept."""
    teacher = compiled(HEAD.format(name="t", body="full * 4"), seed=3)
    body = "swa(window=64); swa(window=64); swa(window=1); swa(window=64)"
    student = compiled(HEAD.format(name="s", body=body), seed=4)
    init_student(teacher, student)
    pairs = line_up(teacher.ir, student.ir)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(ids, -1, 1)
    scores = rank_layers(TrainModel(teacher), TrainModel(student), pairs, [Batch(ids, labels)])
    assert set(scores) == {0, 1, 2, 3}
    assert max(scores[i] for i in (0, 1, 3)) < 1e-9 < 1e-4 < scores[2]
    assert choose(scores, 0.25) == [2]
    hybrid = compiled(
        print_program(
            hybrid_program(
                load_or_raise(HEAD.format(name="s", body=body)).program, pairs, [2], student.ir.config
            )
        )
    )
    state = hybrid_state(hybrid, student.state_dict(), teacher.state_dict(), [2])
    assert torch.equal(state["blocks.2.mixers.0.q_proj.weight"], teacher.blocks[2].mixers[0].q_proj.weight)
    assert torch.equal(state["blocks.1.mixers.0.q_proj.weight"], student.blocks[1].mixers[0].q_proj.weight)
