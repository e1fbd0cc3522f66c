"""`parse(print_program(ir)) == ir` for generated programs, and `fmt` is idempotent on real files."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lt2dsl.grammar.parse import KEYWORDS, parse
from lt2dsl.ir import nodes as n
from lt2dsl.ir.printer import print_program

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*ROOT.glob("examples/*.lt2"), *ROOT.glob("tests/grammar/inputs/*.lt2")])

# ---- strategies -------------------------------------------------------------------------------

# Names: a fixed pool (fast to draw) that includes `T`, underscores, digits and near-keywords.
names = st.sampled_from(
    [
        "gdn",
        "dsa",
        "full",
        "swa",
        "heads",
        "topk",
        "mlp",
        "swiglu",
        "x",
        "T",
        "_a1",
        "sparse",
        "loops",
        "model2",
        "Nonee",
        "exit",
        "gate",
    ]
)
comment_text = st.text(
    st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters="\x7f"), max_size=12
).map(lambda s: ("# " + s).rstrip())
comments = st.lists(comment_text, max_size=2).map(tuple)
trailing = st.none() | comment_text

scalars = st.one_of(
    st.builds(n.Int, value=st.integers(-(2**70), 2**70) | st.sampled_from([1024, 32768, 2**20, 5632, 0])),
    st.builds(n.Float, value=st.floats(allow_nan=False, allow_infinity=False)),
    st.builds(n.Frac, num=st.integers(-1000, 1000), den=st.integers(1, 1000)),
    st.builds(n.Str, value=st.text(max_size=8)),
    st.builds(n.Bool, value=st.booleans()),
    st.just(n.NoneVal()),
    st.builds(n.Name, value=names),
)


def args_of(values):
    arg = st.builds(n.Arg, name=st.none() | names, value=values)
    return st.lists(arg, max_size=2).map(tuple)


values = st.recursive(scalars, lambda inner: st.builds(n.Call, name=names, args=args_of(inner)), max_leaves=3)
arguments = args_of(values)
plain_calls = st.builds(n.Call, name=names, args=arguments)


def with_comments(strategy):
    """The node in statement position, where it may carry comments."""
    return st.tuples(strategy, comments, trailing).map(
        lambda t: t[0].model_copy(update={"comments": t[1], "trailing": t[2]})
    )


counts = st.integers(-3, 5000)


def items(depth: int = 2):
    """Items without comments of their own (their stack items may have some)."""
    pars = st.builds(n.Par, calls=st.lists(plain_calls, min_size=1, max_size=2).map(tuple))
    leaf = st.one_of(plain_calls, pars)
    if depth == 0:
        return leaf
    stack = st.lists(with_comments(items(depth - 1)), max_size=3).map(tuple)
    return st.one_of(
        leaf,
        st.builds(n.Loop, T=counts, options=arguments, body=stack),
        st.builds(n.Repeat, n=counts, body=stack),
        st.builds(n.Times, item=items(depth - 1), n=counts),
    )


programs = st.builds(
    n.Program,
    name=st.none() | names,
    settings=st.lists(with_comments(st.builds(n.Setting, name=names, value=values)), max_size=3).map(tuple),
    lets=st.lists(with_comments(st.builds(n.Let, name=names, item=items(1))), max_size=2).map(tuple),
    body=st.lists(with_comments(items(2)), max_size=3).map(tuple),
    header=comments,
    footer=comments,
)


# ---- properties -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_parse_print_roundtrip(program):
    text = print_program(program)
    parsed, diags = parse(text)
    assert diags == [], f"{diags}\n---\n{text}"
    assert parsed == program, text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_print_is_a_fixed_point(program):
    text = print_program(program)
    parsed, _ = parse(text)
    assert print_program(parsed) == text


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_fmt_is_idempotent_on_files(path):
    program, diags = parse(path.read_text(), str(path))
    assert diags == []
    once = print_program(program)
    again, _ = parse(once)
    assert again == program
    assert print_program(again) == once


def test_generated_names_are_not_keywords():
    assert not set(names.elements) & set(KEYWORDS)


def test_there_are_files_to_format():
    assert len(FILES) >= 3
