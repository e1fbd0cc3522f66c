"""Loading a teacher: a `.lt2` with its weights, or an `LT2ForCausalLM` folder (`save_pretrained`)."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.distill.teacher import load_teacher

from .helpers import random_teacher


def test_a_saved_lt2_for_causal_lm_folder_loads_as_the_same_teacher(tmp_path):
    pytest.importorskip("transformers")
    from lt2dsl.hf import to_hf

    program, weights = random_teacher(tmp_path, "loop T=2 < full >; full")
    teacher = load_teacher(program, weights, None, "reference").model
    to_hf(teacher).save_pretrained(str(tmp_path / "hf"))
    again = load_teacher(None, None, tmp_path / "hf", "reference")
    assert "loop T=2" in again.text
    a, b = teacher.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not any(p.requires_grad for p in again.model.parameters())


def test_weights_that_do_not_fit_the_program_are_refused(tmp_path):
    _, weights = random_teacher(tmp_path, "full * 2")
    (tmp_path / "deeper").mkdir()
    program, _ = random_teacher(tmp_path / "deeper", "full * 3")
    with pytest.raises(ValueError, match=r"missing: `blocks\.2"):
        load_teacher(program, weights, None, "reference")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no `model\.safetensors`"):
        load_teacher(program, tmp_path / "empty", None, "reference")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"`.*junk\.safetensors` is not a safetensors file"):
        load_teacher(program, junk, None, "reference")
