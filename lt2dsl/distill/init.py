"""A student's first weights, taken from its teacher (`init_student`).

Everything outside the mixers — the embedding, the LM head, the final norm, each block's norms and
MLP, each loop's adapter and exit gate — is copied. A mixer the student shares with the teacher
(same kind, same options) is copied whole. Any other mixer starts from the teacher's softmax
attention as its kind's `LayerSpec.from_attention` declares (data beside the spec, like the HF
weight maps): q/k/v and the output projection from the teacher's, heads repeated where the student
has more of them than the teacher (GQA's shared k/v heads), head dims equal; the kind's other
parameters (gates, β, short convs, decays, output norms) keep the values its `reset_parameters`
gives them (mixers.md), as the freshly built student already holds them.

`plan_init` decides all of this from the two resolved programs alone (parameter shapes from the
estimate's table, `cost.estimate.model_weights`), so a student that cannot start from its teacher
is refused before any weight exists; `init_student` carries the plan out.

A repeated head of the output projection (axis 1) is divided by its repeat count, so a student
whose repeated heads compute the same values sums them to the teacher's output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lt2dsl.cost.estimate import model_weights
from lt2dsl.distill.lineup import E_FROM, Mismatch, Pair, line_up
from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import REGISTRY, lookup
from lt2dsl.ir.spec import FromAttention

# The softmax-attention kinds a converted student mixer starts from.
ATTENTION_KINDS = ("full", "swa")
# The teacher's head count for each of its projections (by the weight's module name).
TEACHER_HEADS = {
    "q_proj": "heads",
    "k_proj": "kv_heads",
    "v_proj": "kv_heads",
    "o_proj": "heads",
    "g_proj": "heads",
}


@dataclass(frozen=True)
class FromHeads:
    """Student weight ← teacher weight `source`, `have` heads along `axis` repeated to `want`."""

    source: str
    have: int
    want: int
    axis: int


@dataclass
class InitReport:
    """Where each student parameter starts: `copied` (the teacher's of the same name),
    `from_attention` (student name → `FromHeads`), `initial` (its own initial value); `dropped`:
    teacher mixer weights of replaced blocks that the student has no place for."""

    copied: list[str] = field(default_factory=list)
    from_attention: dict[str, FromHeads] = field(default_factory=dict)
    initial: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)


def init_student(teacher, student) -> InitReport:
    """Overwrite `student`'s parameters (an `LT2Model`) from `teacher`'s (module docstring).

    Raises:
        Mismatch: the student does not line up with the teacher, or one of its mixers cannot start
            from the teacher's (another head dim, a kind without `from_attention`).
    """
    plan = plan_init(teacher.ir, student.ir)
    source, copied = dict(teacher.named_parameters()), set(plan.copied)
    with torch.no_grad():
        for name, p in student.named_parameters():
            if name in plan.from_attention:
                r = plan.from_attention[name]
                p.copy_(expand_heads(source[r.source], r.have, r.want, r.axis).to(p.dtype))
            elif name in copied:
                p.copy_(source[name].to(p.dtype))
    return plan


def plan_init(teacher: n.Model, student: n.Model) -> InitReport:
    """Where each of `student`'s parameters starts (`InitReport`), from the programs alone."""
    pairs = line_up(teacher, student)
    report = InitReport(pairs=pairs)
    t_weights, s_weights = model_weights(teacher), model_weights(student)
    used: set[str] = set()
    for name, shape in s_weights.items():
        parts = name.split(".")
        pair = pairs[int(parts[1])] if parts[0] == "blocks" and parts[2] == "mixers" else None
        if pair is None or not pair.converted:
            if t_weights.get(name) != shape:
                raise AssertionError(f"internal error in `plan_init`: `{name}` lines up but differs")
            report.copied.append(name)
            continue
        rule = _rules(pair).get(".".join(parts[4:]))
        source = ".".join([*parts[:4], rule.source]) if rule is not None else None
        if source not in t_weights:
            report.initial.append(name)
            continue
        report.from_attention[name] = _from_heads(pair, name, rule, source, t_weights[source], shape)
        used.add(source)
    converted = {f"blocks.{p.index}.mixers." for p in pairs if p.converted}
    report.dropped = [k for k in t_weights if k not in used and any(k.startswith(c) for c in converted)]
    return report


def _rules(pair: Pair) -> dict[str, FromAttention]:
    """The student kind's `from_attention`, checked to apply to this pair."""
    t, s = pair.teacher.mixers[0], pair.student.mixers[0]
    if t.type not in ATTENTION_KINDS:
        raise Mismatch(
            E_FROM,
            f"student block `{pair.student.id}` is `{s.type}`, the teacher's is `{t.type}`: a student "
            f"mixer starts from softmax attention ({_names(ATTENTION_KINDS)}) or is the teacher's",
            pair.student.span,
            label=f"cannot start from `{t.type}`",
            teacher=pair.teacher.span,
        )
    rules = lookup(s.type).from_attention
    if not rules:
        able = [kind for kind, sp in REGISTRY.items() if sp.from_attention]
        raise Mismatch(
            E_FROM,
            f"`{s.type}` declares no initialisation from attention (`from_attention` of its spec)",
            pair.student.span,
            label=f"student block `{pair.student.id}`",
            help=f"kinds that start from attention: {_names(able)}",
        )
    return dict(rules)


def _from_heads(pair: Pair, name: str, rule: FromAttention, source: str, have_shape, want) -> FromHeads:
    """How the teacher's `source` (shape `have_shape`) becomes the student's `name` (shape `want`)."""
    local = name.split(".", 4)[4]
    if rule.heads is None:
        if tuple(have_shape) != tuple(want):
            _head_mismatch(pair, local, rule, f"shape {list(want)}", f"shape {list(have_shape)}")
        return FromHeads(source, 1, 1, 0)
    have = int(pair.teacher.mixers[0].opts[TEACHER_HEADS[rule.source.split(".")[0]]])
    heads = int(pair.student.mixers[0].opts[rule.heads])
    axis = rule.axis
    d_t, d_s = have_shape[axis] // have, want[axis] // heads
    rest = [x for i, x in enumerate(want) if i != axis] == [x for i, x in enumerate(have_shape) if i != axis]
    if d_t != d_s or want[axis] != heads * d_s or not rest:
        _head_mismatch(pair, local, rule, f"heads of {d_s} dims", f"heads of {d_t} dims")
    if heads % have:
        raise Mismatch(
            E_FROM,
            f"`{local}` of student block `{pair.student.id}` has {heads} heads (`{rule.heads}`), not a "
            f"multiple of the teacher's {have} for `{rule.source}`",
            pair.student.span,
            label="its heads cannot repeat the teacher's",
            teacher=pair.teacher.span,
        )
    return FromHeads(source, have, heads, axis)


def expand_heads(w: torch.Tensor, have: int, want: int, axis: int) -> torch.Tensor:
    """`w` with `have` heads along `axis` → `want` heads, head h of the result being head
    h // (want / have) of `w` (GQA's query-to-kv-head rule). Along axis 1 (the inputs of an output
    projection) the repeats are divided by their count, so equal heads sum to the original."""
    g = want // have
    if g == 1:
        return w
    heads = w.unflatten(axis, (have, w.shape[axis] // have))
    out = heads.repeat_interleave(g, dim=axis).flatten(axis, axis + 1)
    return out / g if axis == 1 else out


def _head_mismatch(pair: Pair, local: str, rule: FromAttention, student: str, teacher: str):
    s = pair.student.mixers[0]
    raise Mismatch(
        E_FROM,
        f"`{local}` of student block `{pair.student.id}` (`{s.type}`) has {student}, the teacher "
        f"attention's `{rule.source}` {teacher}",
        pair.student.span,
        label="different head dims than the teacher's",
        help=f"give the student the teacher's head dims: `head_dim = {_head_dim(pair)}` and no value "
        "or key expansion (e.g. `gdn(expand_v=1)`, `gla(expand_k=1)`)",
        teacher=pair.teacher.span,
    )


def _head_dim(pair: Pair) -> int:
    return pair.teacher.mixers[0].opts["head_dim"]


def _names(kinds) -> str:
    return ", ".join(f"`{k}`" for k in kinds)
