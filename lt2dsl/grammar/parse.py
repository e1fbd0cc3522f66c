""".lt2 text → surface IR (`Program`), with a `Span` on every node and comments kept for `fmt`.

`parse(text)` never raises on bad input: a syntax error becomes one `Diagnostic` (codes E00xx,
see `syntax_errors.py`) and the program is None. Lark runs LALR with the contextual lexer and
`propagate_positions` and the basic lexer (the post-lexer looks one token ahead, which a
contextual lexer does not allow); `Newlines`, the post-lexer, decides which newlines separate items.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedInput, VisitError
from lark.lark import PostLex
from lark.tree import Meta

from lt2dsl.diagnostics import Diagnostic, error
from lt2dsl.grammar import comments as cm
from lt2dsl.ir import nodes as n
from lt2dsl.source import Span

GRAMMAR = Path(__file__).with_name("lt2.lark")
KEYWORDS = {
    "model": "MODEL",
    "let": "LET",
    "loop": "LOOP",
    "repeat": "REPEAT",
    "par": "PAR",
    "true": "TRUE",
    "false": "FALSE",
    "none": "NONE",
}
# Deeper nesting of loops, repeats, copies and call values is refused (E0017): every later
# stage recurses over the tree, and no real model comes near it.
MAX_DEPTH = 64
NESTING = frozenset({"loop", "repeat", "times", "call_value"})
SIZE_SUFFIX = {"k": 1024, "M": 1024**2}
MAX_DIGITS = 40  # longer integer literals are typos (and Python refuses to convert > 4300 digits)


class Newlines(PostLex):
    """Keeps only the newlines that separate two items.

    A newline is dropped inside parentheses, after `{ } < ; , (`, before `} > ) < ;`, at the
    start and end of the file, and when it follows another newline.
    """

    DROP_AFTER = frozenset({"LBRACE", "RBRACE", "LESSTHAN", "SEMICOLON", "COMMA", "LPAR"})
    DROP_BEFORE = frozenset({"RBRACE", "MORETHAN", "RPAR", "LESSTHAN", "SEMICOLON"})

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        depth, prev, pending = 0, None, None
        for tok in stream:
            if tok.type == "_NL":
                if depth == 0 and prev is not None and prev not in self.DROP_AFTER:
                    pending = pending or tok
                continue
            if pending is not None and tok.type not in self.DROP_BEFORE:
                yield pending
            pending = None
            depth += {"LPAR": 1, "RPAR": -1 if depth else 0}.get(tok.type, 0)
            yield tok
            prev = tok.type


_local = threading.local()


def _collect_comment(tok: Token) -> Token:
    comments = getattr(_local, "comments", None)
    if comments is not None:
        comments.append(tok)
    return tok


@cache
def parser() -> Lark:
    """The one Lark instance (built once: building the LALR tables is the slow part)."""
    return Lark(
        GRAMMAR.read_text(),
        parser="lalr",
        lexer="basic",
        propagate_positions=True,
        maybe_placeholders=True,
        postlex=Newlines(),
        start=["start", "value_only"],
        lexer_callbacks={"COMMENT": _collect_comment},
    )


class ParseProblem(Exception):
    """A problem found while building nodes (a bad number, a non-integer count)."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


# ---- entry points -----------------------------------------------------------------------------


def parse(text: str, file: str = "<input>") -> tuple[n.Program | None, list[Diagnostic]]:
    """Parse a whole `.lt2` file. Returns (program, []) or (None, [the syntax error(s)])."""
    from lt2dsl.grammar.syntax_errors import syntax_diagnostic

    _local.comments = []
    try:
        tree = parser().parse(text, start="start")
    except UnexpectedInput as e:
        return None, [syntax_diagnostic(e, text, file)]
    finally:
        comments, _local.comments = _local.comments, None
    if (deep := _too_deep(tree, file)) is not None:
        return None, [deep]
    builder = ToIR(file, cm.plan(tree, comments, text))
    try:
        prog = builder.transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, ParseProblem):
            return None, [e.orig_exc.diagnostic]
        raise
    if builder.problems:
        return None, builder.problems
    return prog, []


def parse_value(text: str, file: str = "<value>", col: int = 1) -> n.Node:
    """One value (`--set key=value`): `1024`, `32k`, `8/3`, `1e-6`, `true`, `sdpa`, `swiglu(hidden=8k)`.

    Raises `ValueError` with a user-readable message when `text` is not a value. `col` shifts the
    spans (the column where the value starts on its line).
    """
    from lt2dsl.grammar.syntax_errors import syntax_diagnostic

    try:
        tree = parser().parse(text, start="value_only")
    except UnexpectedInput as e:
        d = syntax_diagnostic(e, text, file, value_only=True)
        raise ValueError(f"invalid value `{text}`: {d.message}") from None
    builder = ToIR(file, cm.Plan(), col_offset=col - 1)
    try:
        value = builder.transform(tree).children[0]
    except VisitError as e:
        if isinstance(e.orig_exc, ParseProblem):
            raise ValueError(f"invalid value `{text}`: {e.orig_exc.diagnostic.message}") from None
        raise
    if builder.problems:
        raise ValueError(f"invalid value `{text}`: {builder.problems[0].message}")
    return value


def _too_deep(tree: Tree, file: str) -> Diagnostic | None:
    """E0017 when loops, repeats, copies or call values nest deeper than MAX_DEPTH (checked
    without recursion, before anything recurses)."""
    todo = [(tree, 0)]
    while todo:
        t, d = todo.pop()
        d += t.data in NESTING
        if d > MAX_DEPTH:
            line, col = (1, 1) if t.meta.empty else (t.meta.line, t.meta.column)
            span = Span(file=file, line=line, col=col, end_line=line, end_col=col + 1)
            return error(
                "E0017",
                f"the program nests more than {MAX_DEPTH} levels deep",
                span,
                label="too deeply nested",
                help="flatten the program: a stack of blocks in one loop, or `repeat n`",
            )
        todo += [(c, d) for c in t.children if isinstance(c, Tree)]
    return None


# ---- spans ------------------------------------------------------------------------------------


def span_of(at: Token | Meta, file: str, shift: int = 0) -> Span:
    """The span of a token or of a tree's `meta` (both carry Lark's positions), columns shifted."""
    return Span(
        file=file,
        line=at.line,
        col=at.column + shift,
        end_line=at.end_line,
        end_col=at.end_column + shift,
    )


def short(text: str, limit: int = 30) -> str:
    """Source text quoted in a message, cut to `limit` characters."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def join(a: Span, b: Span) -> Span:
    return Span(file=a.file, line=a.line, col=a.col, end_line=b.end_line, end_col=b.end_col)


# ---- numbers and strings ----------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """Why a literal is not a valid number (the caller turns it into E0016)."""

    why: str


def number(text: str) -> int | float | tuple[int, int] | Bad:
    """The value of a NUMBER token: int, float, (num, den) for a fraction, or Bad."""
    if any(len(part.lstrip("+-")) > MAX_DIGITS for part in text.split("/")) and "." not in text:
        return Bad(f"more than {MAX_DIGITS} digits")
    if "/" in text:
        num, den = text.split("/")
        return Bad("a fraction cannot have a zero denominator") if int(den) == 0 else (int(num), int(den))
    if text[-1] in SIZE_SUFFIX:
        return int(text[:-1]) * SIZE_SUFFIX[text[-1]]
    if any(c in text for c in ".eE"):
        x = float(text)
        return x if math.isfinite(x) else Bad("the number is too large to represent")
    return int(text)


ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


def unquote(text: str) -> str:
    """The value of a STRING token: `\\n \\t \\r \\" \\\\` are escapes; other backslashes stay."""
    body, out, i = text[1:-1], [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body) and body[i + 1] in ESCAPES:
            out.append(ESCAPES[body[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


# ---- the tree → IR transformer ----------------------------------------------------------------

PUNCT = frozenset(
    {
        "LBRACE",
        "RBRACE",
        "LPAR",
        "RPAR",
        "LESSTHAN",
        "MORETHAN",
        "COMMA",
        "SEMICOLON",
        "EQUAL",
        "STAR",
        "MODEL",
        "LET",
        "LOOP",
        "REPEAT",
        "PAR",
        "T_KW",
    }
)


def _nodes(children: list) -> list:
    """Children without punctuation tokens and empty placeholders."""
    return [c for c in children if c is not None and not (isinstance(c, Token) and c.type in PUNCT)]


@v_args(meta=True)
class ToIR(Transformer):
    """Builds IR nodes bottom-up. Problems in literals are collected in `problems`, not raised."""

    def __init__(self, file: str, plan: cm.Plan, col_offset: int = 0):
        super().__init__()
        self.file, self.plan, self.shift = file, plan, col_offset
        self.problems: list[Diagnostic] = []

    def _span(self, meta) -> Span:
        return span_of(meta, self.file, self.shift)

    def _tok(self, tok: Token) -> Span:
        return span_of(tok, self.file, self.shift)

    # -- top level --
    def start(self, meta, children):
        (child,) = children
        if isinstance(child, n.Program):
            return child
        settings, lets, body = _split(child)
        first = child[0].span if child else Span(file=self.file, line=1, col=1, end_line=1, end_col=1)
        return n.Program(
            settings=settings,
            lets=lets,
            body=body,
            span=first,
            header=self.plan.header,
            footer=self.plan.footer,
        )

    def model(self, meta, children):
        kw, name, entries = children[0], children[1], children[3]
        settings, lets, body = _split(entries)
        return n.Program(
            name=name.value,
            settings=settings,
            lets=lets,
            body=body,
            span=join(self._tok(kw), self._tok(name)),
            header=self.plan.header,
            footer=self.plan.footer,
        )

    def entries(self, meta, children):
        return [self.plan.attach(c) for c in _nodes(children)]

    stack = entries

    def setting(self, meta, children):
        name, _, value = children
        return n.Setting(name=name.value, value=value, span=self._span(meta), name_span=self._tok(name))

    def let(self, meta, children):
        _, name, _, item = children
        return n.Let(name=name.value, item=item, span=self._span(meta), name_span=self._tok(name))

    # -- items --
    def times(self, meta, children):
        item, _, (count, cspan) = children
        return n.Times(item=item, n=count, n_span=cspan, span=self._span(meta))

    def call_item(self, meta, children):
        name, *rest = children
        args = rest[0] if rest else ()
        return n.Call(name=name.value, args=args or (), span=self._span(meta), name_span=self._tok(name))

    call_value = call_item

    def args(self, meta, children):
        return tuple(_nodes(children))

    def named_arg(self, meta, children):
        name, _, value = children
        return n.Arg(name=name.value, value=value, span=self._span(meta), name_span=self._tok(name))

    def pos_arg(self, meta, children):
        (value,) = children
        return n.Arg(value=value, span=self._span(meta))

    def loop(self, meta, children):
        t_kw = children[1]
        (count, cspan), *rest = _nodes(children)
        *options, body = rest
        return n.Loop(
            T=count,
            options=tuple(options),
            body=tuple(body),
            span=self._span(meta),
            T_span=join(self._tok(t_kw), cspan),
        )

    def repeat(self, meta, children):
        (count, cspan), body = _nodes(children)
        return n.Repeat(n=count, body=tuple(body), n_span=cspan, span=self._span(meta))

    def par(self, meta, children):
        return n.Par(calls=tuple(_nodes(children)), span=self._span(meta))

    def count(self, meta, children):
        (tok,) = children
        span = self._tok(tok)
        value = self._number(tok)
        if isinstance(value, n.Int):
            return value.value, span
        self.problems.append(
            error(
                "E0009",
                f"expected a whole number, found `{tok.value}`",
                span,
                label="not an integer",
                help="loop counts (`T=`), `repeat` counts and `* n` are integers",
            )
        )
        return 0, span

    # -- values --
    def _number(self, tok: Token) -> n.Node | None:
        span = self._tok(tok)
        v = number(tok.value)
        if isinstance(v, Bad):
            self.problems.append(error("E0016", f"invalid number `{short(tok.value)}`", span, label=v.why))
            return n.Int(value=0, span=span)
        if isinstance(v, tuple):
            return n.Frac(num=v[0], den=v[1], span=span)
        return n.Float(value=v, span=span) if isinstance(v, float) else n.Int(value=v, span=span)

    def number(self, meta, children):
        return self._number(children[0])

    def string(self, meta, children):
        return n.Str(value=unquote(children[0].value), span=self._span(meta))

    def true(self, meta, children):
        return n.Bool(value=True, span=self._span(meta))

    def false(self, meta, children):
        return n.Bool(value=False, span=self._span(meta))

    def none(self, meta, children):
        return n.NoneVal(span=self._span(meta))

    def name(self, meta, children):
        return n.Name(value=children[0].value, span=self._span(meta))


def _split(entries: list) -> tuple[tuple, tuple, tuple]:
    settings = tuple(e for e in entries if isinstance(e, n.Setting))
    lets = tuple(e for e in entries if isinstance(e, n.Let))
    body = tuple(e for e in entries if not isinstance(e, n.Setting | n.Let))
    return settings, lets, body
