"""Syntax errors in user words: Lark's parser state → a catalogued `Diagnostic` (codes E00xx).

Each `SyntaxRule` lists malformed snippets. When a parse fails, Lark's `match_examples` finds the
snippet whose failure happened in the same parser state (and, preferably, on the same kind of
token); that rule names the problem. Failures no snippet explains fall back to E0001 (unexpected
token) or E0004 (unexpected end of file), which still say in words what was expected. Lexer
failures are told apart by the offending character (E0002, E0003, E0016). Every snippet is also a
test case (`tests/grammar/test_syntax_errors.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from lt2dsl.diagnostics import Diagnostic, Label, error
from lt2dsl.source import Span


@dataclass(frozen=True)
class SyntaxRule:
    """One catalogued syntax error. `message` may use `{found}` (what the parser saw)."""

    code: str
    title: str
    message: str
    label: str
    help: str | None
    why: str
    examples: tuple[str, ...]
    fixed: str
    opener: str | None = None  # the bracket whose unclosed opening gets a secondary label


R = SyntaxRule
# Order matters: on a tie (same parser state, no snippet failing on the same token type) the
# rule listed first wins.
CATALOGUE: tuple[SyntaxRule, ...] = (
    R(
        "E0005",
        "loop or repeat not closed",
        "expected `>` to close the stack, found {found}",
        "expected `>`",
        "close the stack with `>`",
        "A `loop` or `repeat` stack runs from `<` to the matching `>`; without it the parser cannot "
        "tell where the shared blocks end.",
        (
            "loop T=2 < gdn",
            "loop T=2 < gdn;",
            "loop T=2 < gdn(heads=4)",
            "loop T=2 <",
            "repeat 2 < gdn",
            "loop T=2 < gdn * 2",
            "model m { loop T=2 < gdn }",
            "model m { loop T=2 < gdn; }",
            "model m { loop T=2 < }",
            "loop T=2 < loop T=2 < gdn >",
            "loop T=2 < par(gdn, swa)",
            "model m { loop T=2 < par(gdn, swa) }",
            "model m { loop T=2 < gdn(heads=4) }",
            "model m { loop T=2 < gdn * 2 }",
            "loop T=2 < gdn )",
            "loop T=2 < gdn; )",
        ),
        "loop T=2 < gdn; dsa >",
        opener="<",
    ),
    R(
        "E0014",
        "setting or let inside a stack",
        "settings and `let`s belong at the top level, not inside a stack",
        "not allowed here",
        "move it before the `loop` or `repeat`; to change one block, pass an option: `gdn(heads=8)`",
        "A stack holds blocks only. Model settings and `let` bindings are written at the top of the "
        "model (or file), where they apply to every block.",
        (
            "loop T=2 < dim = 3 >",
            "loop T=2 < gdn; dim = 3 >",
            "loop T=2 < let a = gdn >",
            "loop T=2 < gdn; let a = gdn >",
            "repeat 2 < heads = 4 >",
            "loop T=2 < gdn\nlet a = gdn >",
        ),
        "let a = gdn\nloop T=2 < a; dsa >",
    ),
    R(
        "E0006",
        "missing separator",
        "expected `;` or a newline between two blocks, found {found}",
        "expected `;` or a newline",
        "separate the blocks with `;` or put them on separate lines",
        "Blocks in a stack and entries of a model are separated by `;` or by a newline, so that each "
        "block's options are unambiguous.",
        (
            "gdn gdn",
            "gdn(heads=4) gdn",
            "loop T=2 < gdn gdn >",
            "loop T=2 < gdn(heads=4) gdn >",
            "loop T=2 < gdn > gdn",
            "dim = 3 gdn",
            "let a = gdn gdn",
            "gdn loop T=2 < gdn >",
            "gdn par(gdn, swa)",
            "loop T=2 < gdn > loop T=2 < gdn >",
            "model m { gdn gdn }",
            "model m { dim = 3 heads = 4 }",
            "dim = 3 heads = 4",
            "gdn repeat 2 < gdn >",
            "loop T=2 < gdn loop T=2 < gdn > >",
            "par(gdn, swa) gdn",
            "gdn * 2 gdn",
            "loop T=2 < gdn * 2 gdn >",
            "loop T=2 < par(gdn, swa) gdn >",
            "model m { gdn(heads=4) gdn }",
            "model m { let a = gdn gdn }",
            "model m { loop T=2 < gdn > gdn }",
            "let a = gdn(heads=4) gdn",
            "gdn T",
            "loop T=2 < gdn T >",
            "model m { gdn T }",
            "gdn let a = gdn",
            "gdn(heads=4) let a = gdn",
            "loop T=2 < gdn > let a = gdn",
            "dim = 3 let a = gdn",
        ),
        "gdn; gdn",
    ),
    R(
        "E0007",
        "`=` without a value",
        "expected a value after `=`, found {found}",
        "expected a value",
        "write a value after `=`: a number, `true`/`false`, `none`, a name or a call",
        "Every `name =` needs a value; a missing one usually means a line was cut short.",
        (
            "dim =",
            "dim =\ngdn",
            "dim = ;",
            "model m { dim = }",
            "gdn(heads=)",
            "gdn(heads=, conv=4)",
            "loop T=2, final_norm= < gdn >",
            "dim = >",
            "dim = )",
            "gdn(heads=>",
            "mlp = swiglu(hidden=)",
            "model m { dim =\n gdn }",
            "dim = =",
            "gdn(heads==4)",
        ),
        "dim = 1024",
    ),
    R(
        "E0008",
        "loop without `T=`",
        "expected `T=` after `loop`, found {found}",
        "expected `T=`",
        "a loop is written `loop T=<count> < blocks >`",
        "The iteration count of a loop is always written `T=n`, so a reader sees at once how many "
        "times the shared blocks run.",
        (
            "loop 4 < gdn >",
            "loop < gdn >",
            "loop t=4 < gdn >",
            "loop",
            "loop n=4 < gdn >",
            "loop T 4 < gdn >",
            "loop T < gdn >",
            "loop T",
            "loop(T=4) < gdn >",
            "loop = 4 < gdn >",
        ),
        "loop T=4 < gdn >",
    ),
    R(
        "E0009",
        "count is not a whole number",
        "expected a whole number, found {found}",
        "expected a number",
        "loop counts (`T=`), `repeat` counts and `* n` are integers",
        "Loop iterations and copies are counted in whole blocks.",
        (
            "loop T= < gdn >",
            "loop T=x < gdn >",
            "loop T=",
            "repeat x < gdn >",
            "repeat < gdn >",
            "repeat",
            "gdn * x",
            "gdn *",
            "gdn * (2)",
            "loop T=1.5 < gdn >",
            "repeat 2.5 < gdn >",
            "gdn * 1/2",
            'loop T="4" < gdn >',
            "gdn * ;",
            "loop T=2 < gdn * >",
        ),
        "loop T=4 < gdn >",
    ),
    R(
        "E0010",
        "stack without `<`",
        "expected `<` to open the stack, found {found}",
        "expected `<`",
        "write the blocks between `<` and `>`: `loop T=2 < gdn; dsa >`",
        "The blocks of a `loop` or `repeat` are written between `<` and `>`.",
        (
            "loop T=2 gdn >",
            "loop T=2 gdn",
            "repeat 2 gdn >",
            "loop T=2, final_norm=true gdn",
            "loop T=2 >",
            "loop T=2",
            "repeat 2",
            "loop T=2\ngdn",
            "loop T=2 { gdn }",
            "repeat 2 { gdn }",
            "repeat 2 ( gdn )",
            "loop T=2, final_norm=true",
            "loop T=2 ; gdn",
            "repeat 2 ;",
        ),
        "loop T=2 < gdn >",
    ),
    R(
        "E0011",
        "unclosed parenthesis",
        "expected `,` or `)`, found {found}",
        "expected `,` or `)`",
        "close the argument list with `)`, and separate arguments with `,`",
        "Options of a call are written `(name=value, ...)`; the list ends at `)`.",
        (
            "gdn(heads=4",
            "gdn(heads=4 conv=4)",
            "gdn(heads=4; gdn",
            "par(gdn, swa",
            "par(gdn swa)",
            "dim = swiglu(hidden=4",
            "gdn(heads=4 >",
            "loop T=2 < gdn(heads=4 >",
            "gdn(",
            "gdn(4",
            "par(gdn",
            "par(",
            "gdn(heads=4 }",
            "model m { gdn(heads=4 }",
            "gdn(heads=4 > gdn",
            "dim = swiglu(",
            "gdn(4 4)",
            "gdn(mlp=swiglu(hidden=4)",
            "loop T=2, exit=gate(threshold=0.9 < gdn >",
            "par(gdn, swa(window=4)",
            "par(gdn(heads=4) swa)",
            "gdn(heads=4, conv=4",
        ),
        "gdn(heads=4, conv=4)",
        opener="(",
    ),
    R(
        "E0012",
        "unclosed model",
        "expected `}}` to close the model, found {found}",
        "expected `}}`",
        "close the model with `}`",
        "A model's settings and blocks run from `{` to the matching `}`.",
        (
            "model m { gdn",
            "model m {",
            "model m { dim = 3",
            "model m { gdn; gdn",
            "model m { let a = gdn",
            "model m { gdn(heads=4)",
            "model m { gdn * 2",
            "model m { loop T=2 < gdn >",
            "model m { par(gdn, swa)",
            "model m { repeat 2 < gdn >",
            "model m { gdn;",
            "model m { dim = swiglu(hidden=4)",
            "model m { let a = gdn(heads=4)",
        ),
        "model m {\n  dim = 1024\n  gdn\n}",
        opener="{",
    ),
    R(
        "E0013",
        "keyword used as a name",
        "`{found}` is a keyword and cannot be used as a name",
        "keyword",
        "choose another name",
        "`model`, `let`, `loop`, `repeat`, `par`, `true`, `false` and `none` have a fixed meaning in "
        "`.lt2`, so they cannot name a `let`, a model, a setting or an option.",
        (
            "let loop = gdn",
            "let model = gdn",
            "let true = gdn",
            "let none = gdn",
            "let par = gdn",
            "let repeat = gdn",
            "let let = gdn",
            "let false = gdn",
            "model loop { }",
            "model par {",
            "model true {",
            "model none {",
            "gdn(loop=3)",
            "gdn(repeat=1)",
            "gdn(model=1)",
            "gdn(let=1)",
            "gdn(par=1)",
            "loop T=2 < gdn(loop=3) >",
            "model m { let loop = gdn }",
            "gdn(heads=4, loop=3)",
            "par(gdn, loop)",
            "par(loop)",
        ),
        "let looped = gdn",
    ),
    R(
        "E0015",
        "par takes mixer calls",
        "`par` takes two or more mixer calls, found {found}",
        "expected a mixer",
        "write the mixers that run side by side: `par(gdn, swa(window=512))`",
        "`par(a, b, ...)` runs several token mixers on the same input inside one block; loops, repeats "
        "and copies are not mixers.",
        (
            "par()",
            "par(repeat 2 < gdn >)",
            "par gdn",
            "par",
            "par(gdn * 2)",
            "par(par(gdn, swa), gdn)",
            "par(gdn, repeat 2 < gdn >)",
            "par(gdn, gdn * 2)",
            "par(5)",
            "par(gdn, 5)",
            "par(gdn;)",
            "par(gdn, swa) (",
            "par(gdn, par(swa, gdn))",
            "par(gdn, swa * 2)",
            "par(gdn(heads=4) * 2)",
            "par(gdn(heads=4), swa * 2)",
            'par("x")',
        ),
        "par(gdn, swa(window=512))",
    ),
    R(
        "E0018",
        "model without a name",
        "expected a model name after `model`, found {found}",
        "expected a name",
        "name the model: `model my_model { ... }`",
        "The model's name labels its reports and its lowered module.",
        ("model { dim = 3 }", "model {", "model", "model 3 {", 'model "m" {', "model = 3"),
        "model my_model { dim = 1024 }",
    ),
    R(
        "E0019",
        "text after the model",
        "expected the end of the file after the model, found {found}",
        "the model ended here",
        "put everything inside `model name { ... }`",
        "A file holds one model; everything it contains goes between its braces.",
        (
            "model m { gdn } gdn",
            "model m { gdn }\ngdn",
            "model m { gdn } }",
            "model m { gdn };",
            "model m { } model n { }",
            "model m { gdn } >",
            "model m { gdn } )",
            "model m { gdn } 5",
            "model m { gdn } dim = 3",
            "model m { gdn } {",
            "model m { gdn } loop T=2 < gdn >",
            "model m {} let a = gdn",
            "model m {} par(gdn, swa)",
            "model m {} repeat 2 < gdn >",
            'model m {} "x"',
            "model m {} (",
            "model m {} <",
            "model m {} *",
            "model m {} ,",
            "model m {} =",
            "model m {} true",
        ),
        "model m {\n  gdn\n}",
    ),
    R(
        "E0020",
        "unmatched closing bracket",
        "unmatched {found}",
        "nothing to close here",
        "remove it, or add the opening bracket it was meant to close",
        "Every `>`, `)` and `}` closes a bracket opened before it.",
        (
            "gdn >",
            "gdn }",
            "gdn )",
            ">",
            "}",
            ")",
            "loop T=2 < gdn > >",
            "dim = 3 )",
            "dim = 3 >",
            "dim = 3 }",
            "gdn(heads=4) )",
            "gdn(heads=4) >",
            "gdn(heads=4) }",
            "loop T=2 < gdn > )",
            "loop T=2 < gdn > }",
            "gdn; >",
            "gdn; )",
            "gdn; }",
            "par(gdn, swa) )",
            "par(gdn, swa) >",
            "par(gdn, swa) }",
            "gdn * 2 )",
            "gdn * 2 >",
            "gdn * 2 }",
            "let a = gdn )",
            "let a = gdn >",
            "let a = gdn }",
            "dim = swiglu(hidden=4) )",
            "model m { gdn > }",
            "model m { gdn ) }",
            "model m { > }",
            "model m { gdn; > }",
            "model m { dim = 3 ) }",
            "model m { gdn(heads=4) ) }",
            "model m { let a = gdn ) }",
            "model m { loop T=2 < gdn > > }",
        ),
        "loop T=2 < gdn >",
    ),
    R(
        "E0021",
        "expected a block",
        "expected a block, found {found}",
        "expected a block",
        "write a layer such as `gdn`, a `loop`, a `repeat` or a `par(...)`; remove a doubled `;`",
        "Each entry of a stack is a block: a layer call, a `loop`, a `repeat`, a `par(...)` or a copy "
        "`item * n`.",
        (
            "loop T=2 < 5 >",
            "loop T=2 < ; >",
            "gdn;;gdn",
            ";",
            "loop T=2 < gdn; ; gdn >",
            "5",
            '"x"',
            "let a = 5",
            "let a =",
            "loop T=2 < = >",
            "1e-6",
            "true",
            "none",
            "let a = ;",
            "let a = true",
            "(gdn)",
            "model m { 5 }",
            "model m { ; }",
            "model m { gdn;; }",
            "*",
            "=",
            ",",
            "<",
            "{",
            "loop T=2 < true >",
            "loop T=2 < gdn; 5 >",
            "loop T=2 < , >",
            "loop T=2 < ( >",
            "model m { gdn; 5 }",
            "let a = (",
            "let a = >",
            "repeat 2 < 5 >",
            'loop T=2 < "x" >',
        ),
        "loop T=2 < gdn; dsa >",
    ),
    R(
        "E0022",
        "`let` without `=`",
        "expected `=` after the name, found {found}",
        "expected `=`",
        "a binding is written `let name = block`",
        "A `let` binds a name to a block with `=`.",
        (
            "let a gdn",
            "let a",
            "let a < gdn >",
            "let a; gdn",
            "model m { let a gdn }",
            "let a(heads=4) = gdn",
            "let a 5",
            "let a == gdn",
        ),
        "let a = gdn",
    ),
    R(
        "E0023",
        "expected a name",
        "expected a name, found {found}",
        "expected a name",
        "write the option or binding name before `=`",
        "Options are written `name=value` and bindings `let name = block`; the name comes first.",
        (
            "let = gdn",
            "let 5 = gdn",
            "gdn(=3)",
            "gdn(heads=4, =3)",
            "let",
            'let "a" = gdn',
            "gdn(,)",
            "gdn(heads=4,,)",
            "loop T=2, < gdn >",
            "loop T=2, = 3 < gdn >",
            "let ( = gdn",
            "let ; gdn",
            "gdn(heads=4, ,)",
            "dim = swiglu(,)",
            "par(,)",
            "par(gdn,,swa)",
            "loop T=2,, < gdn >",
        ),
        "gdn(heads=4, conv=4)",
    ),
)

# Lexer-level problems, told apart by the character (no parser state to match on).
LEXICAL: tuple[SyntaxRule, ...] = (
    R(
        "E0002",
        "unexpected character",
        "unexpected character `{found}`",
        "not part of the language",
        "remove it; comments start with `#`",
        "Only names, numbers, strings, the brackets `{ } ( ) < >` and `= , ; *` appear in `.lt2` text.",
        ("gdn @ dsa", "loop T=2 < gdn $ >", "dim = 3 % 2", "gdn // comment", "gdn & dsa"),
        "gdn  # a comment",
    ),
    R(
        "E0003",
        "unterminated string",
        "unterminated string",
        "the string starts here",
        'close the string with `"` on the same line',
        "Strings are written in double quotes and end on the line where they start.",
        ('gdn(name="first', 'gdn(name="a\nb")', 'dim = "x'),
        'gdn(name="first")',
    ),
    R(
        "E0016",
        "invalid number",
        "invalid number `{found}`",
        "not a number",
        "numbers are written `2048`, `32k`, `1M`, `0.5`, `1e-6` or `8/3`",
        "A number is an integer (with an optional `k` = 1024 or `M` = 1024² suffix), a float or an "
        "exact fraction; anything else glued to it is a typo.",
        ("gdn(heads=32kb)", "gdn(heads=1.2.3)", "dim = 1e999", "dim = 8/0", "dim = 2K", "dim = 3x"),
        "dim = 32k",
    ),
)

GENERIC: tuple[SyntaxRule, ...] = (
    R(
        "E0001",
        "unexpected token",
        "expected {expected}, found {found}",
        "expected {expected}",
        None,
        "The text does not follow the grammar at this point; the message says what could come next.",
        ("gdn(heads=4) 1.5",),
        "gdn(heads=4)",
    ),
    R(
        "E0004",
        "unexpected end of file",
        "expected {expected}, found the end of the file",
        "expected {expected}",
        None,
        "The file ends in the middle of a construct.",
        ("model m",),
        "model m { dim = 64; gdn }",
    ),
    R(
        "E0017",
        "nesting too deep",
        "the program nests more than 64 levels deep",
        "too deeply nested",
        "flatten the program: a stack of blocks in one loop, or `repeat n`",
        "Loops, repeats, copies and call values nest at most 64 levels: every stage of the compiler "
        "walks the program recursively, and no real model comes near the limit.",
        ("loop T=1 < " * 65 + "gdn" + " >" * 65,),
        "repeat 65 < gdn >",
    ),
)

ALL: tuple[SyntaxRule, ...] = tuple(sorted((*GENERIC, *LEXICAL, *CATALOGUE), key=lambda r: r.code))
BY_CODE = {r.code: r for r in ALL}

# ---- user words for Lark's terminal names ----------------------------------------------------

WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "LBRACE": "`{`",
    "RBRACE": "`}`",
    "LPAR": "`(`",
    "RPAR": "`)`",
    "LESSTHAN": "`<`",
    "MORETHAN": "`>`",
    "COMMA": "`,`",
    "SEMICOLON": "`;`",
    "_NL": "a newline",
    "EQUAL": "`=`",
    "STAR": "`*`",
    "T_KW": "`T`",
    "MODEL": "`model`",
    "LET": "`let`",
    "LOOP": "`loop`",
    "REPEAT": "`repeat`",
    "PAR": "`par`",
    "TRUE": "`true`",
    "FALSE": "`false`",
    "NONE": "`none`",
    "$END": "the end of the file",
}
BLOCK_START = {"LOOP", "REPEAT", "PAR"}
VALUE_START = {"NUMBER", "STRING", "TRUE", "FALSE", "NONE"}
ORDER = [
    "LET",
    "MODEL",
    "NAME",
    "T_KW",
    "NUMBER",
    "STRING",
    "TRUE",
    "FALSE",
    "NONE",
    "LOOP",
    "REPEAT",
    "PAR",
    "EQUAL",
    "LPAR",
    "RPAR",
    "COMMA",
    "SEMICOLON",
    "_NL",
    "STAR",
    "LESSTHAN",
    "MORETHAN",
    "LBRACE",
    "RBRACE",
    "$END",
]


def expected_words(accepts: set[str]) -> str:
    """`{'SEMICOLON', '_NL', 'MORETHAN'}` → "`;`, a newline or `>`"."""
    acc = set(accepts)
    words = []
    if acc >= BLOCK_START:
        words.append("a block")
        acc -= BLOCK_START | {"NAME", "T_KW"}
    if acc >= VALUE_START:
        words.append("a value")
        acc -= VALUE_START | {"NAME", "T_KW"}
    if {"NAME", "T_KW"} <= acc:
        acc.discard("T_KW")
    words += [WORDS.get(t, t) for t in sorted(acc, key=lambda t: ORDER.index(t) if t in ORDER else 99)]
    if len(words) <= 1:
        return words[0] if words else "something else"
    return ", ".join(words[:-1]) + " or " + words[-1]


def found(tok: Token) -> str:
    if tok.type == "$END":
        return "the end of the file"
    if tok.type == "_NL":
        return "a newline"
    if tok.type == "STRING":
        return f"string {short(tok.value)}"
    if tok.type in {"MODEL", "LET", "LOOP", "REPEAT", "PAR", "TRUE", "FALSE", "NONE"}:
        return f"keyword `{tok.value}`"
    return f"`{short(tok.value)}`"


# ---- classification ---------------------------------------------------------------------------


def short(text: str) -> str:
    from lt2dsl.grammar.parse import short as cut

    return cut(text)


def _normalized(e: UnexpectedInput, text: str) -> UnexpectedInput:
    """Compare failures by what the parser would have accepted there and the token before.

    Lark's `ParserState` equality compares the LALR state and the stack depth, so a snippet would
    match only at one nesting level and after one particular kind of item. What the user-facing
    problem depends on is what could come next ("expected `>`" is the same problem after `gdn`
    as after `dsa(topk=64)`) and, to tell `let a` from `loop T`, the token before.
    """
    if isinstance(e, UnexpectedToken) and not isinstance(e.state, tuple):
        e.state = (frozenset(e.accepts or e.expected or ()), _previous_type(text, e.token))
    return e


def _previous_type(text: str, tok: Token) -> str | None:
    from lt2dsl.grammar.parse import parser

    end = len(text) if tok.type == "$END" else tok.start_pos
    prev = None
    try:
        for t in parser().lex(text[:end]):
            prev = t.type
    except UnexpectedInput:
        pass
    return prev


@cache
def _example_error(text: str) -> UnexpectedInput | None:
    from lt2dsl.grammar.parse import parser

    try:
        parser().parse(text, start="start")
    except UnexpectedInput as e:
        return _normalized(e, text)
    return None


def _raise_example(text: str):
    # The cached error is raised again for every syntax error a run meets; raising an exception
    # object adds the raising frames to its traceback, so without a fresh traceback the cache
    # would hold every frame of every earlier match (a process checking many inputs grows
    # without bound, and each garbage collection walks all of it).
    if (e := _example_error(text)) is not None:
        raise e.with_traceback(None)


def match(e: UnexpectedToken, text: str) -> SyntaxRule | None:
    """The catalogued rule whose snippets fail like `e` does (Lark's `match_examples`).

    A rule counts only when one of its snippets fails in the same state on the same kind of
    token; a match on the state alone could name the wrong problem, and E0001 / E0004 (which
    list what was expected) are better than a wrong name.
    """
    e = _normalized(e, text)
    rule = e.match_examples(
        _raise_example, [(r, r.examples) for r in CATALOGUE], token_type_match_fallback=True
    )
    if rule is None or not any(_same_failure(e, _example_error(x)) for x in rule.examples):
        return None
    return rule


def _same_failure(e: UnexpectedToken, ex: UnexpectedInput | None) -> bool:
    return (
        isinstance(ex, UnexpectedToken)
        and ex.state == e.state
        and ex.accepts == e.accepts
        and ex.token.type == e.token.type
    )


def syntax_diagnostic(e: UnexpectedInput, text: str, file: str, value_only: bool = False) -> Diagnostic:
    """The one diagnostic for a failed parse."""
    if isinstance(e, UnexpectedCharacters):
        return _lexical(e, text, file)
    if not isinstance(e, UnexpectedToken):  # e.g. UnexpectedEOF, which LALR does not raise today
        line, col = _end_of_code(text)
        span = Span(file=file, line=line, col=col, end_line=line, end_col=col + 1)
        return error("E0004", "unexpected end of the file", span, label="the file ends here")
    tok = e.token
    span = _token_span(tok, text, file)
    accepts = (e.accepts or e.expected) or set()
    rule = None if value_only else match(e, text)
    if rule is None:
        rule = BY_CODE["E0004" if tok.type == "$END" else "E0001"]
    what = short(tok.value) if rule.code == "E0013" else found(tok)
    expected = expected_words(accepts)
    return error(
        rule.code,
        rule.message.format(found=what, expected=expected),
        span,
        label=rule.label.format(expected=expected),
        help=rule.help,
        labels=_opener_label(rule.opener, text, tok, file),
    )


def _lexical(e: UnexpectedCharacters, text: str, file: str) -> Diagnostic:
    pos = e.pos_in_stream
    c = text[pos]
    if c == '"':
        rule, word = BY_CODE["E0003"], c
        end = text.find("\n", pos)
        length = (len(text) if end < 0 else end) - pos
    elif c.isdigit() or (c in "+-." and pos + 1 < len(text) and text[pos + 1].isdigit()):
        word = re.match(r"[\w.+\-/]+", text[pos:]).group(0)
        rule, length = BY_CODE["E0016"], len(word)
    else:
        rule, word, length = BY_CODE["E0002"], c, 1
    span = Span(file=file, line=e.line, col=e.column, end_line=e.line, end_col=e.column + max(length, 1))
    return error(rule.code, rule.message.format(found=short(word)), span, label=rule.label, help=rule.help)


def _token_span(tok: Token, text: str, file: str) -> Span:
    if tok.type == "$END":
        line, col = _end_of_code(text)
        return Span(file=file, line=line, col=col, end_line=line, end_col=col + 1)
    if tok.type == "_NL" or tok.end_line != tok.line:
        return Span(file=file, line=tok.line, col=tok.column, end_line=tok.line, end_col=tok.column + 1)
    return Span(file=file, line=tok.line, col=tok.column, end_line=tok.end_line, end_col=tok.end_column)


def _end_of_code(text: str) -> tuple[int, int]:
    """Line and column just after the last character that is not blank or a comment."""
    lines = text.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        code = _strip_comment(lines[i]).rstrip()
        if code:
            return i + 1, len(code) + 1
    return 1, 1


def _strip_comment(line: str) -> str:
    in_str = False
    for i, c in enumerate(line):
        if c == '"' and (i == 0 or line[i - 1] != "\\"):
            in_str = not in_str
        elif c == "#" and not in_str:
            return line[:i]
    return line


CLOSERS = {"<": ">", "(": ")", "{": "}"}


def _opener_label(opener: str | None, text: str, tok: Token, file: str) -> tuple[Label, ...]:
    """A secondary label at the innermost unclosed `opener` before the error."""
    if opener is None:
        return ()
    end = len(text) if tok.type == "$END" else tok.start_pos
    stack: list[tuple[str, int]] = []
    for i, c in _code_chars(text[:end]):
        if c in CLOSERS:
            stack.append((c, i))
        elif c in CLOSERS.values() and stack and CLOSERS[stack[-1][0]] == c:
            stack.pop()
    pos = next((i for c, i in reversed(stack) if c == opener), None)
    if pos is None:
        return ()
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return (
        Label(
            span=Span(file=file, line=line, col=col, end_line=line, end_col=col + 1),
            message=f"unclosed `{opener}`",
        ),
    )


def _code_chars(text: str):
    """(index, char) of the characters outside comments and strings."""
    in_str = in_comment = False
    for i, c in enumerate(text):
        if in_comment:
            in_comment = c != "\n"
        elif in_str:
            in_str = not (c == '"' and text[i - 1] != "\\") and c != "\n"
        elif c == "#":
            in_comment = True
        elif c == '"':
            in_str = True
        else:
            yield i, c
