"""Syntax errors: every catalogue snippet is a test, messages use user words, spans point right."""

import re

import pytest

from lt2dsl.diagnostics import render
from lt2dsl.grammar.parse import parse
from lt2dsl.grammar.syntax_errors import ALL, CATALOGUE, WORDS, expected_words
from lt2dsl.source import SourceFile

CASES = [(r.code, ex) for r in ALL for ex in r.examples]


def first(text: str):
    prog, diags = parse(text, "t.lt2")
    assert prog is None and len(diags) == 1, diags
    return diags[0]


@pytest.mark.parametrize(("code", "text"), CASES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CASES)])
def test_every_snippet_gets_its_code(code, text):
    d = first(text)
    assert d.code == code, f"{text!r}: got {d.code} {d.message}"
    assert d.span.known


@pytest.mark.parametrize("rule", ALL, ids=[r.code for r in ALL])
def test_catalogue_entries_are_complete(rule):
    assert re.fullmatch(r"E00\d\d", rule.code)
    assert rule.title and rule.why and rule.fixed
    fixed, diags = parse(rule.fixed)
    assert fixed is not None and diags == [], f"the fix of {rule.code} does not parse"


def test_codes_are_unique():
    codes = [r.code for r in ALL]
    assert len(codes) == len(set(codes))


def test_no_lark_words_reach_the_user():
    """Messages and labels never show Lark's terminal names (`__ANON_3`, `MORETHAN`, `$END`)."""
    lark_names = set(WORDS) | {"__ANON", "Token("}
    for _, text in CASES:
        d = first(text)
        for word in lark_names:
            assert word not in d.message and word not in d.label, (text, d)


def test_expected_words():
    assert expected_words({"SEMICOLON", "_NL", "MORETHAN"}) == "`;`, a newline or `>`"
    assert expected_words({"LOOP", "REPEAT", "PAR", "NAME", "T_KW"}) == "a block"
    assert expected_words({"NUMBER", "STRING", "TRUE", "FALSE", "NONE", "NAME", "T_KW"}) == "a value"
    assert expected_words({"$END"}) == "the end of the file"


def test_unclosed_loop_points_at_the_end_and_at_the_opening():
    text = "dim = 3\nloop T=4 < gdn; dsa(topk=64)\n# the end\n"
    d = first(text)
    assert d.code == "E0005"
    assert (d.span.line, d.span.col) == (2, 29)  # just after the last token, not at the comment
    (opened,) = d.labels
    assert (opened.span.line, opened.span.col) == (2, 10) and "unclosed `<`" in opened.message
    shown = render(d, {"t.lt2": SourceFile(name="t.lt2", text=text)})
    assert "expected `>` to close the stack, found the end of the file" in shown


def test_unclosed_paren_across_lines():
    d = first("model m {\n  loop T=2 <\n    dsa(topk=4\n  >\n}\n")
    assert d.code == "E0011" and (d.span.line, d.span.col) == (4, 3)
    assert d.labels[0].span.line == 3


def test_error_in_nested_context_matches_like_the_snippet():
    # the snippets are one level deep; the same problem deeper must get the same code
    assert first("loop T=2 < loop T=3 < repeat 2 < gdn gdn > > >").code == "E0006"
    assert first("model m { loop T=2 < loop T=2 < gdn(heads=4) }").code == "E0005"


def test_keyword_as_name():
    d = first("let loop = gdn")
    assert d.code == "E0013" and d.message == "`loop` is a keyword and cannot be used as a name"
    assert (d.span.col, d.span.end_col) == (5, 9)


def test_lexical_errors():
    assert first('gdn(name="abc)').code == "E0003"
    d = first("gdn(heads=32kb)")
    assert d.code == "E0016" and d.message == "invalid number `32kb`" and d.span.end_col - d.span.col == 4
    assert first("gdn @").code == "E0002"


def test_non_integer_counts():
    d = first("loop T=1.5 < gdn >")
    assert d.code == "E0009" and "`1.5`" in d.message


def test_generic_fallback_still_says_what_was_expected():
    d = first("gdn(heads=4) 1.5")
    assert d.code == "E0001"
    assert d.message == "expected `;`, a newline, `*` or the end of the file, found `1.5`"


def test_catalogue_order_is_stable():
    # rules earlier in the catalogue win ties; E0005 must come before E0006 (see the module doc)
    codes = [r.code for r in CATALOGUE]
    assert codes.index("E0005") < codes.index("E0006")


def _frames_held_by_the_example_cache() -> int:
    from lt2dsl.grammar.syntax_errors import _example_error

    held = 0
    for rule in CATALOGUE:
        for text in rule.examples:
            tb = getattr(_example_error(text), "__traceback__", None)
            while tb is not None:
                held, tb = held + 1, tb.tb_next
    return held


def test_matching_many_syntax_errors_holds_no_more_frames():
    """A process that checks many inputs (an editor, the fuzz campaign) must not keep the frames
    of every syntax error it matched alive."""
    bad = "dim = 64\nloop T=2 < gla(expand_k=0.5 gate_rank=16) >\n"
    parse(bad, "x.lt2")
    held = _frames_held_by_the_example_cache()
    for _ in range(3):
        parse(bad, "x.lt2")
    assert _frames_held_by_the_example_cache() == held
