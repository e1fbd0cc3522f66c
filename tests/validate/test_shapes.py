"""Shapes (E05xx, W05xx) on the resolved model, pointing at what the user wrote."""

import pytest

from tests.validate.helpers import at, codes, errors, one


def test_gqa_on_the_model_and_on_a_call():
    d = one("dim = 512\nheads = 8\nkv_heads = 3\nfull", "E0501")
    assert at(d) == (3, 12, 13)
    d = one("dim = 512\nheads = 8\nkv_heads = 4\nfull(heads=6)", "E0501")
    assert at(d) == (4, 12, 13) and "(6)" in d.message
    assert codes("dim = 512\nheads = 8\nkv_heads = 2\nfull; swa(heads=4); dsa(kv_heads=8)") == []
    # an MHA model keeps MHA when a block overrides heads
    assert codes("dim = 512\nheads = 8\nfull(heads=6)") == []


def test_gva():
    assert at(one("dim = 512\ngdn(heads=4, v_heads=6)", "E0502")) == (2, 22, 23)
    assert codes("dim = 512\nkda(heads=4, v_heads=8)") == []


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("dim = 512\nhead_dim = 100\ngla(expand_k=3/8)", (3, 14, 17)),
        ("dim = 512\nhead_dim = 101\ngla", (2, 12, 15)),  # only the model setting is written
        ("dim = 512\nretnet(head_dim=33, expand_v=1/2)", (2, 30, 33)),
        ("dim = 512\nmlstm(qk_dim_factor=0.1, head_dim=16)", (2, 21, 24)),
    ],
)
def test_derived_head_dims(text, where):
    assert at(one(text, "E0503")) == where


def test_mamba2_width():
    assert codes("dim = 512\nmamba2") == []
    assert codes("dim = 512\nmamba2(heads=16, head_dim=64)") == []
    d = one("dim = 512\nmamba2(heads=10)", "E0504")
    assert at(d) == (2, 14, 16) and "1024" in d.message


def test_tmm():
    assert codes("dim = 512\nmax_len = 4k\ntmm(heads=4)") == []
    assert at(one("dim = 512\nmax_len = 4k\ntmm(heads=3)", "E0505")) == (3, 11, 12)
    assert codes("dim = 512\ntmm") == ["E0506"]
    assert codes("dim = 512\ntmm(max_len=2k)") == []
    assert codes("dim = 512\ntmm", max_len="2k") == []
    assert codes("dim = 512\nlet t = tmm\nt(max_len=2k)") == []
    d = one("dim = 512\nlet t = tmm(heads=2)\nt; t", "E0506")  # once, at the `tmm` inside the let
    assert at(d) == (2, 9, 12)


def test_nsa_stride():
    assert codes("dim = 512\nnsa") == []
    d = one("dim = 512\nnsa(stride=24)", "E0507")
    assert "`cmp_block` (32) and `block` (64)" in d.message
    assert codes("dim = 512\nnsa(stride=32, cmp_block=64, block=64)") == []


def test_model_head_dim():
    assert errors("dim = 1000\nheads = 8\ngdn") == []
    assert errors("dim = 1000\nheads = 16\nhead_dim = 64\ngdn") == []
    d = one("dim = 1000\ngdn", "E0508")  # heads defaults to max(1, 1000 / 128) = 7
    assert "default" in d.message and at(d) == (1, 7, 11)


def test_windows_and_topk_against_max_len():
    assert codes("dim = 512\nmax_len = 4k\nswa(window=4k); nsa(window=4k)") == []
    d = one("dim = 512\nmax_len = 4k\nswa(window=8k)", "W0501")
    assert d.severity == "warning" and at(d) == (3, 12, 14)
    assert codes("dim = 512\nmax_len = 4k\nnsa(window=5k)") == ["W0501"]
    assert codes("dim = 512\nmax_len = 4k\ndsa(topk=4k)") == ["W0502"]
    assert codes("dim = 512\nmax_len = 4k\ndsa(topk=4095)") == []
    assert codes("dim = 512\ndsa", max_len="2k") == ["W0502"]  # the default top-k is 2048
