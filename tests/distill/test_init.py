"""`init_student`: a student's first weights from its teacher; students that do not line up."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.distill.init import expand_heads, init_student
from lt2dsl.distill.lineup import E_FROM, E_LINEUP, Mismatch
from lt2dsl.ir.registry import REGISTRY

from .helpers import HEAD, compiled

IDS = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))


def pair(teacher_body: str, student_body: str):
    teacher = compiled(HEAD.format(name="t", body=teacher_body), seed=1)
    student = compiled(HEAD.format(name="s", body=student_body), seed=2)
    return teacher, student


def test_an_attention_student_of_more_kv_heads_computes_the_teacher_exactly():
    """GQA (1 kv head) → MHA (2): the k/v heads repeat as GQA shares them, so the logits agree."""
    teacher, student = pair(
        "full * 2; loop T=2 < full >", "full(kv_heads=2) * 2; loop T=2 < full(kv_heads=2) >"
    )
    assert (student(IDS) - teacher(IDS)).abs().max() > 1e-2  # different random weights before
    report = init_student(teacher, student)
    torch.testing.assert_close(student(IDS), teacher(IDS), rtol=0, atol=1e-5)
    assert "blocks.2.mixers.0.k_proj.weight" in report.from_attention


def test_gdn_starts_from_q_k_v_o_and_keeps_its_own_gates_decays_and_convs():
    teacher, student = pair("full * 2", "gdn(expand_v=1) * 2")
    before = {k: v.clone() for k, v in student.state_dict().items()}
    report = init_student(teacher, student)
    t, s = teacher.blocks[1].mixers[0], student.blocks[1].mixers[0]
    assert torch.equal(s.q_proj.weight, t.q_proj.weight) and torch.equal(s.o_proj.weight, t.o_proj.weight)
    # one teacher kv head of 16 dims serves both student heads: rows 0-15 and 16-31 repeat it
    for w, tw in ((s.k_proj.weight, t.k_proj.weight), (s.v_proj.weight, t.v_proj.weight)):
        assert torch.equal(w[:16], tw) and torch.equal(w[16:], tw)
    for name in ("A_log", "dt_bias", "a_proj.weight", "b_proj.weight", "g_proj.weight", "q_conv1d.weight"):
        full = f"blocks.1.mixers.0.{name}"
        assert full in report.initial and torch.equal(student.state_dict()[full], before[full]), name
    for name in (
        "embed.weight",
        "blocks.0.norms.1.weight",
        "blocks.1.mlp.up_proj.weight",
        "final_norm.weight",
    ):
        assert torch.equal(student.state_dict()[name], teacher.state_dict()[name]), name


def test_a_shared_block_of_a_looped_teacher_starts_its_shared_student_block():
    teacher, student = pair("loop T=3 < full; full >", "loop T=3 < gdn(expand_v=1); full >")
    init_student(teacher, student)
    assert torch.equal(student.blocks[0].mixers[0].q_proj.weight, teacher.blocks[0].mixers[0].q_proj.weight)
    assert torch.equal(student.blocks[1].mixers[0].v_proj.weight, teacher.blocks[1].mixers[0].v_proj.weight)
    assert len(student.blocks) == 2 and student.applications == 6


def test_expand_heads_repeats_each_head_and_splits_an_output_projection():
    w = torch.arange(6.0)[:, None]  # 3 heads of 2 rows: (0, 1), (2, 3), (4, 5)
    assert expand_heads(w, 3, 6, 0)[:, 0].tolist() == [0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5]
    o = torch.randn(5, 4)  # an output projection over 2 heads of 2 dims
    x = torch.randn(4)
    x3 = x.unflatten(0, (2, 2)).repeat_interleave(3, dim=0).flatten()  # each head's values thrice
    torch.testing.assert_close(expand_heads(o, 2, 6, 1) @ x3, o @ x)


KIND_STUDENTS = {
    "full": "full",
    "swa": "swa(window=8)",
    "dsa": "dsa(topk=8, index_heads=1, index_dim=8)",
    "nsa": "nsa(block=8, select=2, window=8, cmp_block=8, stride=8)",
    "gdn": "gdn(expand_v=1)",
    "kda": "kda",
    "deltanet": "deltanet",
    "gla": "gla(expand_k=1, kv_heads=1)",
    "retnet": "retnet(expand_v=1)",
    "mlstm": "mlstm(qk_dim_factor=1)",
    "linear": "linear",
}


def test_every_kind_that_declares_from_attention_has_a_student_here():
    assert set(KIND_STUDENTS) == {k for k, spec in REGISTRY.items() if spec.from_attention}


@pytest.mark.parametrize("kind", sorted(KIND_STUDENTS))
def test_each_kind_starts_its_declared_weights_from_the_teacher(kind):
    teacher, student = pair("full(gate=sdpa)", KIND_STUDENTS[kind])
    report = init_student(teacher, student)
    rules = REGISTRY[kind].from_attention
    teacher_has = {n.removeprefix("blocks.0.mixers.0.") for n, _ in teacher.named_parameters()}
    student_has = {n.removeprefix("blocks.0.mixers.0.") for n, _ in student.named_parameters()}
    mapped = {
        f"blocks.0.mixers.0.{w}" for w, r in rules.items() if w in student_has and r.source in teacher_has
    }
    assert set(report.from_attention) == mapped and len(mapped) >= 4
    assert torch.isfinite(student(IDS)).all()


@pytest.mark.parametrize(
    ("student", "code", "words"),
    [
        ("gdn * 2", E_FROM, "heads of 32 dims"),  # expand_v = 2 doubles the value heads
        ("full", E_LINEUP, "no block or loop for the teacher's"),
        ("full; full; full", E_LINEUP, "no teacher block"),
        ("loop T=2 < full; full >", E_LINEUP, "which is a block"),
        ("mamba2(head_dim=16); full", E_FROM, "declares no initialisation from attention"),
        ("full(mlp=swiglu(hidden=32)); full", E_LINEUP, "another `mlp`"),
    ],
)
def test_a_student_that_does_not_line_up_is_refused_naming_its_block(student, code, words):
    teacher, s = pair("full * 2", student)
    with pytest.raises(Mismatch) as e:
        init_student(teacher, s)
    assert e.value.code == code and words in str(e.value)
    assert e.value.diagnostic().span.known  # points into the student's source


def test_loops_must_match_and_settings_must_match():
    teacher, student = pair("loop T=2 < full; full >", "loop T=3 < full; full >")
    with pytest.raises(Mismatch, match="`T` = `3`, the teacher's `2`"):
        init_student(teacher, student)
    wide = compiled(HEAD.format(name="s", body="full * 2").replace("dim = 32", "dim = 64"))
    with pytest.raises(Mismatch, match="student's `dim` is `64`"):
        init_student(compiled(HEAD.format(name="t", body="full * 2")), wide)


def test_a_replaced_mixer_needs_an_attention_teacher():
    teacher, student = pair("gdn(expand_v=1); full", "deltanet; full")
    with pytest.raises(Mismatch, match="starts from softmax attention"):
        init_student(teacher, student)
