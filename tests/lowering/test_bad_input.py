"""Bad input to a lowered model is a ValueError that names what was expected (issue 3, item 5)."""

from __future__ import annotations

import pytest
import torch

from .util import call, lower, tokens


@pytest.fixture(scope="module")
def model():
    return lower(f"{call('gdn')}; {call('swa')}")


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        (torch.zeros(1, 4), r"integer dtype \(torch.long or torch.int32.*float32"),
        (torch.zeros(1, 4, dtype=torch.uint8), r"integer dtype \(torch.long or torch.int32.*uint8"),
        (torch.zeros(1, 4, dtype=torch.int8), r"integer dtype.*int8.*\.long\(\)"),
        (torch.zeros(1, 4, dtype=torch.bool), "integer dtype"),
        (torch.zeros(4, dtype=torch.long), r"shape \[B, T\].*\[4\]"),
        (torch.zeros(1, 4, 2, dtype=torch.long), r"shape \[B, T\]"),
        (torch.zeros(1, 0, dtype=torch.long), "T >= 1"),
        (torch.tensor([[1, 64]]), r"\[0, 64\).*\[1, 64\]"),
        (torch.tensor([[-1, 3]]), r"\[0, 64\)"),
        ([[1, 2]], "torch.Tensor"),
    ],
)
def test_bad_token_ids(model, ids, match):
    with pytest.raises(ValueError, match=match):
        model(ids)


def test_int32_ids_are_accepted(model):
    ids = tokens(1, 3)
    torch.testing.assert_close(model(ids.to(torch.int32)), model(ids))


def test_cache_of_another_batch_or_model(model):
    with pytest.raises(ValueError, match="batch_size=2"):
        model(tokens(1, 3), model.new_cache(2))
    other = lower(f"loop T=3 < {call('swa')} >")
    with pytest.raises(ValueError, match="new_cache"):
        model(tokens(1, 3), other.new_cache(1))
    with pytest.raises(ValueError, match="new_cache"):
        model(tokens(1, 3), {"state": None})
    with pytest.raises(ValueError, match="positive integer"):
        model.new_cache(0)


def test_sequence_past_tmm_max_len():
    model = lower(call("tmm"))  # max_len=32
    model(tokens(1, 32))
    with pytest.raises(ValueError, match="max_len=32"):
        model(tokens(1, 33))
    cache = model.new_cache(1)
    model(tokens(1, 30), cache)
    model(tokens(1, 2), cache)
    with pytest.raises(ValueError, match=r"reach 33 tokens.*max_len=32"):
        model(tokens(1, 1), cache)
    assert cache.seen == 32  # the refused call changed nothing
    # generate runs the prompt and all new tokens but the last: 30 + 3 − 1 tokens fit, one more
    # is refused before anything runs
    assert model.generate(tokens(1, 30), 3).shape == (1, 33)
    with pytest.raises(ValueError, match=r"run 33 tokens.*max_len=32"):
        model.generate(tokens(1, 30), 4)


def test_new_cache_max_len_must_be_a_positive_int():
    model = lower(call("swa"))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_len"):
            model.new_cache(1, bad)


def test_ids_on_another_device_than_the_model():
    meta = lower(call("swa"), device="meta", dtype=torch.float32)
    with pytest.raises(ValueError, match="device meta"):
        meta(tokens(1, 2))
