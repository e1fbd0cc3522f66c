"""Which student block starts from which teacher block: the two programs must line up.

Both resolved models are walked together: a loop pairs with a loop of the same `T` and options, a
block with a block of the same MLP and norm holding one mixer each. Block i of one is then block i
of the other (the same pre-order `LT2Model.blocks` uses), so the parameter names `blocks.<i>.…` and
`loops.<k>.…` name the same place in both, and a looped teacher's shared blocks pair with a looped
student's shared blocks.

A student that does not line up is refused with an `E1101` diagnostic at the student's block (or
its settings); a student mixer that cannot start from its teacher's mixer with `E1102`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.diagnostics import Diagnostic, Label, error
from lt2dsl.ir import nodes as n
from lt2dsl.source import NOWHERE, Span

E_LINEUP = "E1101"
E_FROM = "E1102"
# Settings both models must share for their embeddings, heads and norms to mean the same thing.
SHARED_SETTINGS = ("dim", "vocab", "tie_embeddings", "embed_scale", "head", "norm")
LOOP_FIELDS = ("T", "final_norm", "inject", "exit")


class Mismatch(ValueError):
    """A student that cannot start from its teacher; `diagnostic()` is the same as an error at the
    student's source."""

    def __init__(
        self,
        code: str,
        message: str,
        span: Span = NOWHERE,
        *,
        label: str = "",
        help: str | None = None,
        teacher: Span = NOWHERE,
    ):
        super().__init__(message + (f"\nhelp: {help}" if help else ""))
        self.code, self.message, self.span, self.label, self.help, self.teacher = (
            code,
            message,
            span,
            label,
            help,
            teacher,
        )

    def diagnostic(self) -> Diagnostic:
        """An error at the student's block; the teacher's block is a label in the same file, a
        note naming its place otherwise."""
        labels, notes = (), ()
        if self.teacher.known and self.teacher.file == self.span.file:
            labels = (Label(span=self.teacher, message="the teacher's"),)
        elif self.teacher.known:
            notes = (f"the teacher's block is at {self.teacher}",)
        return error(
            self.code, self.message, self.span, label=self.label, labels=labels, notes=notes, help=self.help
        )


@dataclass(frozen=True)
class Pair:
    """Block `index` of both models: the teacher's block and the student's."""

    index: int
    teacher: n.Block
    student: n.Block

    @property
    def converted(self) -> bool:
        """The student's mixer is not the teacher's (another kind or other options): it is distilled."""
        t, s = self.teacher.mixers[0], self.student.mixers[0]
        return (t.type, t.opts) != (s.type, s.opts)


def line_up(teacher: n.Model, student: n.Model) -> list[Pair]:
    """The blocks of `student` paired with `teacher`'s, in `LT2Model.blocks` order.

    Raises:
        Mismatch: the settings, the loops or the blocks differ (naming the first student block
            that does not line up).
    """
    _check_settings(teacher.config, student.config, student)
    pairs: list[Pair] = []
    _walk(teacher.body, student.body, pairs, student.span)
    return pairs


def _check_settings(t: n.ModelConfig, s: n.ModelConfig, student: n.Model) -> None:
    _require_same(
        t,
        s,
        SHARED_SETTINGS,
        "the student's `{name}` is {student}, the teacher's {teacher}",
        student.span,
        help="set `{name}` as the teacher has it: embeddings, norms and MLPs are copied",
    )


def _require_same(t, s, names: tuple[str, ...], message: str, span: Span, **kw) -> None:
    """Raise a `Mismatch` at `span` for the first of `names` whose value differs between the teacher
    `t` and the student `s`; `message` and `help` are formatted with that `name`, the `teacher`'s and
    the `student`'s shown values and the student's `id`."""
    for name in names:
        tv, sv = getattr(t, name), getattr(s, name)
        if tv != sv:
            fields = {"name": name, "teacher": _show(tv), "student": _show(sv), "id": getattr(s, "id", "")}
            kw["help"] = kw["help"].format(**fields)
            raise Mismatch(E_LINEUP, message.format(**fields), span, **kw)


def _walk(ts: tuple, ss: tuple, pairs: list[Pair], where: Span) -> None:
    for k in range(max(len(ts), len(ss))):
        if k >= len(ss):
            raise Mismatch(
                E_LINEUP,
                f"the student has no block or loop for the teacher's `{ts[k].id}`",
                ss[-1].span if ss else where,
                help=f"the student needs as many blocks as the teacher ({_count(ts)} here)",
                teacher=ts[k].span,
            )
        if k >= len(ts):
            raise Mismatch(
                E_LINEUP,
                f"student `{ss[k].id}` has no teacher block to start from",
                ss[k].span,
                label="one more than the teacher has",
            )
        _stage(ts[k], ss[k], pairs)


def _stage(t: n.Block | n.LoopBlock, s: n.Block | n.LoopBlock, pairs: list[Pair]) -> None:
    if isinstance(t, n.LoopBlock) != isinstance(s, n.LoopBlock):
        kind = "a loop" if isinstance(t, n.LoopBlock) else "a block"
        raise Mismatch(
            E_LINEUP,
            f"student `{s.id}` lines up with the teacher's `{t.id}`, which is {kind}",
            s.span,
            label=f"the teacher has {kind} here",
            teacher=t.span,
        )
    if isinstance(t, n.LoopBlock):
        _check_loop(t, s)
        _walk(t.body, s.body, pairs, s.span)
        return
    _check_block(t, s)
    pairs.append(Pair(len(pairs), t, s))


def _check_loop(t: n.LoopBlock, s: n.LoopBlock) -> None:
    _require_same(
        t,
        s,
        LOOP_FIELDS,
        "student loop `{id}` has `{name}` = {student}, the teacher's {teacher}",
        s.span,
        label="differs from the teacher's loop",
        help="a looped teacher's blocks line up with a loop of the same options",
        teacher=t.span,
    )


def _check_block(t: n.Block, s: n.Block) -> None:
    if len(t.mixers) != 1 or len(s.mixers) != 1:
        if (t.mixers, t.mlp, t.norm) == (s.mixers, s.mlp, s.norm):
            return
        raise Mismatch(
            E_LINEUP,
            f"student block `{s.id}`: `par` blocks start from the teacher only when they are the same",
            s.span,
            teacher=t.span,
        )
    for name in ("mlp", "norm"):
        if getattr(t, name) != getattr(s, name):
            raise Mismatch(
                E_LINEUP,
                f"student block `{s.id}` has another `{name}` than the teacher's `{t.id}`",
                s.span,
                label=f"its `{name}` differs",
                help=f"the teacher's block has `{_spec(getattr(t, name))}`",
                teacher=t.span,
            )


def _show(v) -> str:
    if isinstance(v, n.Node):
        return f"`{_spec(v)}`"
    return f"`{str(v).lower() if isinstance(v, bool) else v}`"


def _spec(node: n.Node) -> str:
    fields = node.model_dump(exclude={"span", "kind"})
    kind = fields.pop("type", type(node).__name__.lower())
    return f"{kind}({', '.join(f'{k}={v}' for k, v in fields.items())})"


def _count(stages: tuple) -> int:
    return sum(_count(s.body) if isinstance(s, n.LoopBlock) else 1 for s in stages)
