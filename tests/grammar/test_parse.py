"""The parser: nodes, values, positions, newlines as separators, comments kept for `fmt`."""

from fractions import Fraction

import pytest

from lt2dsl.grammar.parse import parse, parse_value
from lt2dsl.ir import nodes as n

SEED_EXAMPLE = """\
# LT2-hybrid, GDN + DSA, no full attention (the seed's efficiency variant)
model lt2_gdn_dsa {
  dim      = 2048          # d_model
  vocab    = 32000
  heads    = 16            # default for every mixer that has heads
  head_dim = 128
  mlp      = swiglu(hidden=5632)
  norm     = rmsnorm(eps=1e-6)
  max_len  = 32k           # default sequence length for estimates; required by tmm
  tie_embeddings = true

  let sparse = dsa(topk=2048, index_heads=4, index_dim=64)

  loop T=4 <
    gdn; gdn; gdn; sparse
  >
}
"""


def ok(text: str) -> n.Program:
    prog, diags = parse(text, "t.lt2")
    assert diags == [], diags
    assert prog is not None
    return prog


def test_seed_example_structure():
    p = ok(SEED_EXAMPLE)
    assert p.name == "lt2_gdn_dsa"
    assert [s.name for s in p.settings] == [
        "dim",
        "vocab",
        "heads",
        "head_dim",
        "mlp",
        "norm",
        "max_len",
        "tie_embeddings",
    ]
    assert p.setting("max_len").value == n.Int(value=32768)
    eps = n.Arg(name="eps", value=n.Float(value=1e-6))
    assert p.setting("norm").value == n.Call(name="rmsnorm", args=(eps,))
    (let,) = p.lets
    assert let.name == "sparse" and isinstance(let.item, n.Call) and let.item.name == "dsa"
    (loop,) = p.body
    assert isinstance(loop, n.Loop) and loop.T == 4
    assert [c.name for c in loop.body] == ["gdn", "gdn", "gdn", "sparse"]


def test_bare_body_from_the_spec():
    p = ok("loop T=4 < gdn; dsa(topk=64); full(gate=sdpa) >")
    assert p.name is None and p.settings == ()
    (loop,) = p.body
    assert loop.body[1].arg("topk").value == n.Int(value=64)
    assert loop.body[2].arg("gate").value == n.Name(value="sdpa")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2048", n.Int(value=2048)),
        ("32k", n.Int(value=32768)),
        ("1M", n.Int(value=1024**2)),
        ("-5", n.Int(value=-5)),
        ("1e-6", n.Float(value=1e-6)),
        ("0.5", n.Float(value=0.5)),
        ("1e+16", n.Float(value=1e16)),
        ("8/3", n.Frac(num=8, den=3)),
        ("-8/3", n.Frac(num=-8, den=3)),
        ('"a \\"b\\" \\\\ \\n"', n.Str(value='a "b" \\ \n')),
        ("true", n.Bool(value=True)),
        ("false", n.Bool(value=False)),
        ("none", n.NoneVal()),
        ("sdpa", n.Name(value="sdpa")),
        ("T", n.Name(value="T")),
        ("swiglu()", n.Call(name="swiglu")),
        ("swiglu(hidden=8k)", n.Call(name="swiglu", args=(n.Arg(name="hidden", value=n.Int(value=8192)),))),
        ("gate(0.9)", n.Call(name="gate", args=(n.Arg(value=n.Float(value=0.9)),))),
    ],
)
def test_values(text, expected):
    assert parse_value(text) == expected


def test_fraction_stays_exact():
    assert parse_value("8/3").value == Fraction(8, 3)


@pytest.mark.parametrize(
    "bad", ["", "1 2", "gdn(", "32kb", "loop", "8/0", "1e999", "=", "a b", "9" * 5000, "1/" + "3" * 5000]
)
def test_parse_value_rejects_with_a_readable_message(bad):
    with pytest.raises(ValueError, match="invalid value"):
        parse_value(bad)


def test_positions():
    text = "dim = 1024\nloop T=4 < gdn; dsa(topk=64) >\n"
    p = ok(text)
    dim = p.settings[0]
    assert (dim.span.line, dim.span.col, dim.span.end_col) == (1, 1, 11)
    assert (dim.name_span.col, dim.name_span.end_col) == (1, 4)
    assert (dim.value.span.col, dim.value.span.end_col) == (7, 11)
    loop = p.body[0]
    assert (loop.span.line, loop.span.col, loop.span.end_col) == (2, 1, 31)
    assert (loop.T_span.col, loop.T_span.end_col) == (6, 9)  # `T=4`
    dsa = loop.body[1]
    assert (dsa.name_span.col, dsa.name_span.end_col) == (17, 20)
    topk = dsa.args[0]
    assert (topk.name_span.col, topk.name_span.end_col) == (21, 25)
    assert (topk.value.span.col, topk.value.span.end_col) == (26, 28)


def test_times_repeat_par_positions():
    p = ok("gdn * 3\nrepeat 2 < gdn >\npar(gdn, swa(128))\n")
    times, rep, par = p.body
    assert times.n == 3 and (times.n_span.line, times.n_span.col) == (1, 7)
    assert rep.n == 2 and (rep.n_span.line, rep.n_span.col) == (2, 8)
    assert [c.name for c in par.calls] == ["gdn", "swa"]
    assert par.calls[1].args[0].name is None


def test_times_is_left_associative():
    (t,) = ok("gdn * 2 * 3").body
    assert t.n == 3 and isinstance(t.item, n.Times) and t.item.n == 2


@pytest.mark.parametrize(
    "text",
    [
        "loop T=2 <\n  gdn\n  gdn\n>",
        "loop T=2 < gdn\n gdn >",
        "loop T=2 <\n\n  gdn;\n\n  gdn;\n>",
        "loop T=2 < gdn; gdn; >",
        "loop T=2 <\n  gdn\n  ;gdn\n>",
        "\n\nloop T=2 < gdn; gdn >\n\n",
        "loop T=2 <  # c\n  gdn  # d\n  gdn\n>",
    ],
)
def test_newlines_separate_like_semicolons(text):
    (loop,) = ok(text).body
    assert [c.name for c in loop.body] == ["gdn", "gdn"]


def test_newlines_inside_parentheses_are_ignored():
    (call,) = ok("full(gate=sdpa,\n     qk_norm=true,\n)").body
    assert [a.name for a in call.args] == ["gate", "qk_norm"]


def test_loop_options_and_multiline_header():
    (loop,) = ok("loop T=4,\n  final_norm=true, exit=gate(threshold=0.9) < gdn >").body
    assert [a.name for a in loop.options] == ["final_norm", "exit"]


def test_settings_lets_and_items_are_split_in_any_order():
    p = ok("gdn\ndim = 3\nlet a = dsa\na\nvocab = 5")
    assert [s.name for s in p.settings] == ["dim", "vocab"]
    assert [x.name for x in p.lets] == ["a"]
    assert [c.name for c in p.body] == ["gdn", "a"]


def test_T_is_an_ordinary_name_outside_loops():
    p = ok("let T = gdn\nT(heads=2)")
    assert p.lets[0].name == "T" and p.body[0].name == "T"


def test_empty_inputs():
    assert ok("").body == ()
    assert ok("# only a comment\n").footer == ("# only a comment",)
    assert ok("model m {\n}").name == "m"


def test_comments_go_to_statements():
    p = ok(SEED_EXAMPLE)
    assert p.header == ("# LT2-hybrid, GDN + DSA, no full attention (the seed's efficiency variant)",)
    assert p.setting("dim").trailing == "# d_model"
    assert p.setting("vocab").trailing is None
    text = (
        "dim = 1\n# lead 1\n# lead 2\ngdn  # trail\nloop T=2 <  # head\n  gdn\n  # inner\n  dsa\n>\n# end\n"
    )
    p = ok(text)
    gdn, loop = p.body
    assert gdn.comments == ("# lead 1", "# lead 2") and gdn.trailing == "# trail"
    assert loop.trailing == "# head"
    assert loop.body[1].comments == ("# inner",)
    assert p.footer == ("# end",)


def test_bare_file_header_needs_a_blank_line():
    assert ok("# file header\n\ngdn\n").header == ("# file header",)
    p = ok("# about gdn\ngdn\n")
    assert p.header == () and p.body[0].comments == ("# about gdn",)


def test_comment_inside_arguments_is_kept():
    (call,) = ok("full(gate=sdpa,  # why\n     qk_norm=true)").body
    assert call.trailing == "# why"


@pytest.mark.parametrize(
    "text",
    [
        "loop T=1 < " * 65 + "gdn" + " >" * 65,
        "gdn" + " * 2" * 65,
        "dim = " + "a(" * 65 + ")" * 65,
        "loop T=1 < " * 3000 + "gdn" + " >" * 3000,
    ],
)
def test_too_deep_is_an_error_not_a_crash(text):
    prog, diags = parse(text)
    assert prog is None and [d.code for d in diags] == ["E0017"]


def test_deep_but_allowed():
    ok("loop T=1 < " * 64 + "gdn" + " >" * 64)
