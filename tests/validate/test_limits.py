"""Limits (E0204-E0206): sizes, depth and nesting past what lt2dsl lowers, reported at what was
written and asserted by the lowering for a resolved model built in Python."""

import time

import pytest
import torch

from lt2dsl.grammar.parse import parse
from lt2dsl.ir.limits import MAX_APPLIED, MAX_SIZE, MAX_WIDTH
from lt2dsl.lowering import compile_model
from lt2dsl.passes.resolve import resolve

from .helpers import at, codes, errors, one


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("dim = 1000000000000000000000000000000\ngdn", (1, 7, 38)),
        (f"dim = 64\nvocab = {2**24 + 1}\ngdn", (2, 9, 17)),
        ("dim = 64\nmax_len = 32M\ngdn", (2, 11, 14)),
        (f"dim = 64\ngdn(heads={MAX_WIDTH + 1})", (2, 11, 16)),
        ("dim = 64\nswa(window=1000M)", (2, 12, 17)),
    ],
)
def test_values_past_the_limit(text, where):
    d = one(text, "E0204")
    assert at(d) == where and "above lt2dsl's limit" in d.message and "up to" in d.help


def test_values_at_the_limit_pass():
    assert "E0204" not in codes(f"dim = {MAX_WIDTH}\nvocab = {2**24}\nmax_len = {MAX_SIZE}\ngdn")


def test_an_override_past_the_limit():
    d = one("gdn", "E0204", dim=str(10**12))
    assert d.span.file == "--set dim" and "65,536" in d.help


@pytest.mark.parametrize(
    ("text", "line", "col"),
    [
        ("dim = 64\nloop T=100000 < gdn >", 2, 6),
        ("dim = 64\nloop T=1000000000000000000000000000000 < gdn >", 2, 6),
        ("dim = 64\nrepeat 3000 < gdn >", 2, 8),
        ("dim = 64\ngdn * 2049", 2, 7),
        ("dim = 64\nlet b = loop T=1025 < gdn; gdn >\nb", 3, 1),
        ("dim = 64\n" + "loop T=2 < " * 63 + "gdn" + " >" * 63, 2, 6),
        ("dim = 64\nloop T=1024 < gdn >\nloop T=1024 < gdn >\ngdn", 4, 1),
    ],
    ids=["T=1e5", "T=1e30", "repeat", "times", "let", "2^63", "sum"],
)
def test_too_many_applications(text, line, col):
    d = one(text, "E0205")
    assert (d.span.line, d.span.col) == (line, col) and "2,048" in d.help


def test_applications_at_the_limit_pass():
    assert errors(f"dim = 64\nloop T={MAX_APPLIED // 2} < gdn; gdn >") == []
    assert errors("dim = 64\nloop T=1 < gdn >", loop_T=str(MAX_APPLIED)) == []
    assert one("dim = 64\nloop T=1 < gdn >", "E0205", loop_T=str(MAX_APPLIED + 1))


def test_let_chain_past_the_nesting_limit():
    lines = ["dim = 64", "let a0 = gdn", *(f"let a{i} = a{i - 1}" for i in range(1, 66))]
    d = one("\n".join([*lines, "a65"]), "E0206")
    assert at(d) == (67, 5, 8) and "65 levels" in d.message
    assert errors("\n".join([*lines[:-2], "a63"])) == []  # 64 levels deep (a use is one) is fine


def test_a_long_chain_of_lets_is_an_error_not_a_crash():
    """Also in linear time: resolving each use through the chain again took 36 s for 3,000."""
    lines = ["dim = 64", "let a0 = gdn", *(f"let a{i} = a{i - 1}" for i in range(1, 3000)), "a2999"]
    t0 = time.perf_counter()
    assert errors("\n".join(lines)) == ["E0206"]
    assert time.perf_counter() - t0 < 8


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("dim = 64\nloop T=3000 < gdn >", r"applies 3,000 blocks.*\[E0205\]"),
        (f"dim = {MAX_WIDTH * 2}\nheads = 1\ngdn", r"setting `dim` is 131072, above .* \[E0204\]"),
        ("dim = 64\nswa(window=100M)", r"option `window` of `swa` is 104857600.*\[E0204\]"),
    ],
)
def test_the_lowering_asserts_the_same_limits(text, match):
    """A Model resolved without validation (as Python code may build one) is refused too."""
    program, _ = parse(text)
    with pytest.raises(ValueError, match=match):
        compile_model(resolve(program), device="meta", dtype=torch.float32, fuse=False)


def test_the_estimate_refuses_an_effective_depth_of_2_to_the_63():
    from lt2dsl.cost.estimate import estimate

    program, _ = parse("dim = 64\n" + "loop T=2 < " * 63 + "gdn" + " >" * 63)
    with pytest.raises(ValueError, match=r"about 9\.2e\+18 blocks.*\[E0205\]"):
        estimate(resolve(program))
