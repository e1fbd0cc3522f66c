"""Values (E02xx): types, ranges, counts, with sizes and fractions where numbers go."""

import pytest

from tests.validate.helpers import at, codes, errors, one


@pytest.mark.parametrize(
    "text",
    [
        "dim = 64\nmax_len = 32k\nswa(window=1k)",
        "dim = 64\ngla(expand_k=1/2, gate_norm=16)",
        "dim = 64\ngdn(expand_v=3/2)",
        "dim = 64\nnorm = rmsnorm(1e-5)\nfull(rope_theta=500000)",
        "dim = 64\nloop T=2, exit=gate(threshold=0.5) < gdn >",
        "dim = 64\nloop T=2, exit=gate, inject=concat < gdn >",
        'dim = 64\ngdn(name="first block")',
        "dim = 64\nhead = none\ntie_embeddings = false\ngdn",
    ],
)
def test_valid_values(text):
    assert errors(text) == []


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("dim = 64\ndsa(topk=1.5)", (2, 10, 13)),
        ("dim = 64\ndsa(topk=8/3)", (2, 10, 13)),
        ("dim = 64\nfull(qk_norm=1)", (2, 14, 15)),
        ("dim = 64\ngdn(name=first)", (2, 10, 15)),
        ("dim = 64.0\ngdn", (1, 7, 11)),
        ("dim = 64\nmlp = 4\ngdn", (2, 7, 8)),
        ("dim = 64\nfull(gate=sdpa())", (2, 11, 17)),
    ],
)
def test_wrong_types_point_at_the_value(text, where):
    assert at(one(text, "E0201")) == where


def test_choices_are_names_not_strings():
    d = one('dim = 64\nloop T=2, exit="gate" < gdn >', "E0201")
    assert d.help == "choices are names: write `gate` without quotes"


def test_size_hint_for_float_sizes():
    assert "32k" in one("dim = 64\nmax_len = 3.5e4\ngdn", "E0201").help


@pytest.mark.parametrize(
    ("text", "range_text"),
    [
        ("dim = 64\nloop T=2 < swa(window=-1) >", "an integer >= 1"),
        ("dim = 64\ngla(expand_k=0)", "a number > 0"),
        ("dim = 64\nloop T=2, exit=gate(threshold=1.5) < gdn >", "a number > 0 and <= 1"),
        ("dim = 0\ngdn", "an integer >= 1"),
        ("dim = 64\nkda(lower_bound=1/2)", "a number < 0"),
    ],
)
def test_out_of_range_gives_the_range(text, range_text):
    d = one(text, "E0202")
    assert range_text in d.message


def test_counts():
    assert codes("dim = 64\nloop T=0 < gdn >\nrepeat -1 < gdn >\ngdn * 0") == ["E0203"] * 3


def test_loop_T_override():
    assert codes("dim = 64\nloop T=2 < gdn >", loop_T="0") == ["E0203"]
    d = one("dim = 64\nloop T=2 < gdn >", "E0201", loop_T="1.5")
    assert d.span.file == "--set loop.T"
    assert codes("dim = 64\nloop T=2 < gdn >", loop_T="8") == []
