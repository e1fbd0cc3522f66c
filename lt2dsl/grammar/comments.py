"""Where each `#` comment goes, so `lt2dsl fmt` keeps it.

Statements are the entries of the model / file body and the items of every `loop` / `repeat`
stack; only they hold comments. A comment is placed by these rules, in order:

1. before the `model` keyword: the program's `header`; in a file without `model { }`, the first
   run of comment lines at the top followed by a blank line is the `header`;
2. after code on the same line: the `trailing` comment of the outermost statement that ends on
   that line, else of the outermost statement that starts there (a multi-line loop's first line);
3. otherwise (own line, or the trailing slot was taken): a leading comment of the next statement;
4. with no statement after it: the program's `footer`.

The printer writes comments back where these rules find them again, so `fmt` is idempotent.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from lark import Token, Tree

from lt2dsl.ir import nodes as n

Pos = tuple[int, int]


@dataclass(frozen=True)
class Stmt:
    start: Pos
    end: Pos
    depth: int


@dataclass
class Plan:
    leading: dict[Pos, list[str]] = field(default_factory=dict)
    trailing: dict[Pos, str] = field(default_factory=dict)
    header: tuple[str, ...] = ()
    footer: tuple[str, ...] = ()

    def attach(self, node: n.Node) -> n.Node:
        key = (node.span.line, node.span.col)
        lead, trail = self.leading.get(key), self.trailing.get(key)
        if not lead and trail is None:
            return node
        return node.model_copy(update={"comments": tuple(lead or ()), "trailing": trail})


def statements(tree: Tree) -> list[Stmt]:
    """Every statement of the tree with its nesting depth (entries 0, a loop's items 1, ...)."""
    out: list[Stmt] = []
    todo: list[tuple[Tree, int]] = [(tree, -1)]
    while todo:
        t, depth = todo.pop()
        if t.data in ("entries", "stack"):
            depth += 1
            out += [
                Stmt((c.meta.line, c.meta.column), (c.meta.end_line, c.meta.end_column), depth)
                for c in t.children
                if isinstance(c, Tree)
            ]
        todo += [(c, depth) for c in t.children if isinstance(c, Tree)]
    return sorted(out, key=lambda s: (s.start, s.depth))


def plan(tree: Tree, comments: list[Token], text: str) -> Plan:
    # split on \n only: Lark counts lines that way (str.splitlines also splits on \f, \x1c, ...)
    lines = text.split("\n")
    stmts = statements(tree)
    model_kw = _model_keyword(tree)
    # a final newline ends the last line; it does not start an empty one
    real = lines[:-1] if text.endswith("\n") else lines
    header_lines = set() if model_kw else _bare_header(comments, real, stmts)
    p = Plan()
    header, footer = [], []
    starts = [s.start for s in stmts]
    for c in comments:
        body = c.value.rstrip()
        pos = (c.line, c.column)
        if (model_kw and pos < model_kw) or c.line in header_lines:
            header.append(body)
            continue
        own_line = not lines[c.line - 1][: c.column - 1].strip()
        if not own_line and (target := _trailing_target(stmts, c.line)) and target.start not in p.trailing:
            p.trailing[target.start] = body
            continue
        i = bisect_right(starts, pos)
        if i < len(stmts):
            p.leading.setdefault(stmts[i].start, []).append(body)
        else:
            footer.append(body)
    p.header, p.footer = tuple(header), tuple(footer)
    return p


def _model_keyword(tree: Tree) -> Pos | None:
    first = tree.children[0] if tree.children else None
    if isinstance(first, Tree) and first.data == "model":
        kw = first.children[0]
        return (kw.line, kw.column)
    return None


def _bare_header(comments: list[Token], lines: list[str], stmts: list[Stmt]) -> set[int]:
    """Lines of the first run of comment lines, if it opens the file and a blank line follows."""
    if not comments or any(line.strip() for line in lines[: comments[0].line - 1]):
        return set()
    run = [comments[0].line]
    for c in comments[1:]:
        if c.line != run[-1] + 1 or lines[c.line - 1][: c.column - 1].strip():
            break
        run.append(c.line)
    if lines[run[0] - 1][: comments[0].column - 1].strip():
        return set()
    after = run[-1]  # index of the line after the run (0-based)
    if after >= len(lines) or lines[after].strip():
        return set()
    if stmts and stmts[0].start[0] <= run[-1]:
        return set()
    return set(run)


def _trailing_target(stmts: list[Stmt], line: int) -> Stmt | None:
    ending = [s for s in stmts if s.end[0] == line]
    if ending:
        return min(ending, key=lambda s: (s.depth, -s.end[1]))
    starting = [s for s in stmts if s.start[0] == line]
    return min(starting, key=lambda s: (s.depth, s.start)) if starting else None
