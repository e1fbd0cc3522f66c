"""The canonical `.lt2` printer (language.md §7): `lt2dsl fmt` and `parse(print_program(p)) == p`.

Canonical form:
* settings first, then `let`s, then the body, each group separated by a blank line;
* two-space indentation, one entry per line, `name = value` settings;
* a `loop` / `repeat` stays on one line (`loop T=4 < gdn; gdn; dsa >`) when it fits in
  `WIDTH` columns and nothing inside it carries a comment; otherwise one block per line;
* a `loop` / `repeat` whose stack holds another stack is always one block per line;
* values of size options (`max_len`, `window`, `topk`, `hidden`, ...) that are multiples of 1024
  print with a suffix (`32768` → `32k`, `1048576` → `1M`); other integers print as digits;
  fractions stay fractions (`8/3`); floats print as Python's shortest exact form with a plain
  exponent (`1e-6`), so they read back exactly;
* a call value without arguments prints with `()` (`mlp = swiglu()`) so it stays a call, while a
  block without arguments prints bare (`gdn`);
* comments go where `grammar/comments.py` will find them again.
"""

from __future__ import annotations

from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import lookup
from lt2dsl.ir.settings import EXIT_GATE_OPTIONS, LOOP_OPTIONS, MODEL_SETTINGS
from lt2dsl.ir.spec import Option
from lt2dsl.ir.specs.channel import MLP_KINDS, NORM_KINDS

INDENT = "  "
WIDTH = 100
SUFFIXES = (("M", 1024**2), ("k", 1024))
Schema = tuple[Option, ...]


def print_program(program: n.Program) -> str:
    """The canonical text of `program`, ending in a newline."""
    if program.name is None:
        return _bare(program)
    lines = [*program.header, f"model {program.name} {{"]
    lines += _sections(program, INDENT)
    lines += [INDENT + c for c in program.footer]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _bare(program: n.Program) -> str:
    lines: list[str] = []
    if program.header:
        # the blank line is what marks these comments as the file header (comments.py)
        lines += [*program.header, ""]
    lines += _sections(program, "")
    lines += program.footer
    return "\n".join(lines) + "\n" if lines else ""


def _sections(program: n.Program, indent: str) -> list[str]:
    groups = [
        [line for s in program.settings for line in _setting(s, indent)],
        [line for let in program.lets for line in _let(let, indent)],
        [line for item in program.body for line in statement(item, indent)],
    ]
    out: list[str] = []
    for g in (g for g in groups if g):
        out += [""] if out else []
        out += g
    return out


# ---- statements -------------------------------------------------------------------------------


def _with_comments(node: n.Node, indent: str, lines: list[str]) -> list[str]:
    """Leading comments above the statement, the trailing one after its first line."""
    out = [indent + c for c in node.comments]
    if node.trailing:
        lines = [f"{lines[0]}  {node.trailing}", *lines[1:]]
    return out + lines


def _setting(s: n.Setting, indent: str) -> list[str]:
    opt = _find(MODEL_SETTINGS, s.name)
    return _with_comments(s, indent, [f"{indent}{s.name} = {value(s.value, opt)}"])


def _let(let: n.Let, indent: str) -> list[str]:
    first, *rest = _item_lines(let.item, indent)
    return _with_comments(let, indent, [f"{indent}let {let.name} = {first.lstrip()}", *rest])


def statement(item: n.Node, indent: str) -> list[str]:
    """A stack item or body entry with its comments, as lines at `indent`."""
    return _with_comments(item, indent, _item_lines(item, indent))


def _item_lines(item: n.Node, indent: str) -> list[str]:
    match item:
        case n.Loop() | n.Repeat():
            return _stack_lines(_head(item), item.body, indent)
        case n.Times():
            *first, last = _item_lines(item.item, indent)
            return [*first, f"{last} * {item.n}"]
        case _:
            return [indent + inline(item)]


def _head(item: n.Loop | n.Repeat) -> str:
    if isinstance(item, n.Repeat):
        return f"repeat {item.n}"
    opts = "".join(f", {arg(a, LOOP_OPTIONS)}" for a in item.options)
    return f"loop T={item.T}{opts}"


def _stack_lines(head: str, body: tuple, indent: str) -> list[str]:
    one = f"{indent}{head} < {'; '.join(inline(i) for i in body)} >" if body else f"{indent}{head} < >"
    if len(one) <= WIDTH and all(_inlinable(i) for i in body):
        return [one]
    inner = [line for i in body for line in statement(i, indent + INDENT)]
    return [f"{indent}{head} <", *inner, f"{indent}>"]


def _inlinable(item: n.Node) -> bool:
    """An item fits inside a one-line stack when it has no comment and holds no stack."""
    if item.comments or item.trailing:
        return False
    match item:
        case n.Loop() | n.Repeat():
            return False
        case n.Times():
            return _inlinable(item.item)
    return True


def inline(item: n.Node) -> str:
    """An item on one line (no comments): `gdn(heads=8)`, `loop T=2 < a; b >`, `gdn * 3`."""
    match item:
        case n.Call():
            schema = spec.options if (spec := lookup(item.name)) else ()
            return item.name + (f"({', '.join(arg(a, schema) for a in item.args)})" if item.args else "")
        case n.Loop() | n.Repeat():
            inner = "; ".join(inline(i) for i in item.body)
            return f"{_head(item)} < {inner} >" if inner else f"{_head(item)} < >"
        case n.Times():
            return f"{inline(item.item)} * {item.n}"
        case n.Par():
            return f"par({', '.join(inline(c) for c in item.calls)})"
    raise TypeError(f"not a stack item: {item!r}")


# ---- values -----------------------------------------------------------------------------------


def _find(schema: Schema, name: str | None) -> Option | None:
    if name is None:
        return next((o for o in schema if o.positional), None)
    return next((o for o in schema if o.name == name), None)


def arg(a: n.Arg, schema: Schema = ()) -> str:
    """`name=value` or a positional value; `schema` (the options of the call) picks the value's
    print form (sizes with suffixes)."""
    v = value(a.value, _find(schema, a.name))
    return v if a.name is None else f"{a.name}={v}"


def _call_schema(call: n.Call, opt: Option | None) -> Schema:
    if opt is None:
        return ()
    if opt.type == "mlp":
        return MLP_KINDS.get(call.name, ())
    if opt.type == "norm":
        return NORM_KINDS.get(call.name, ())
    return EXIT_GATE_OPTIONS if (opt.name, call.name) == ("exit", "gate") else ()


def value(v: n.Node, opt: Option | None = None) -> str:
    """A value as `.lt2` text; `opt` (the option it is written for) decides size suffixes."""
    match v:
        case n.Int():
            return size(v.value) if opt is not None and opt.type == "size" else str(v.value)
        case n.Float():
            return floating(v.value)
        case n.Frac():
            return f"{v.num}/{v.den}"
        case n.Str():
            return string(v.value)
        case n.Bool():
            return "true" if v.value else "false"
        case n.NoneVal():
            return "none"
        case n.Name():
            return v.value
        case n.Call():
            schema = _call_schema(v, opt)
            return f"{v.name}({', '.join(arg(a, schema) for a in v.args)})"
    raise TypeError(f"not a value: {v!r}")


def size(x: int) -> str:
    """`32768` → `32k`, `1048576` → `1M`; other integers stay digits."""
    for suffix, unit in SUFFIXES:
        if x and x % unit == 0:
            return f"{x // unit}{suffix}"
    return str(x)


def floating(x: float) -> str:
    """`repr` (the shortest text that reads back exactly) with a plain exponent: `1e-06` → `1e-6`."""
    text = repr(x)
    if "e" not in text:
        return text
    mant, exp = text.split("e")
    sign = "-" if exp.startswith("-") else ""
    return f"{mant}e{sign}{exp.lstrip('+-').lstrip('0') or '0'}"


STRING_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def string(s: str) -> str:
    return '"' + "".join(STRING_ESCAPES.get(c, c) for c in s) + '"'
