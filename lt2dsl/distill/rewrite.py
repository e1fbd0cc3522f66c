"""Writing chosen blocks back into a `.lt2` program: the hybrid student after layer selection.

`replace_blocks(program, calls)` returns the surface program with each block named by its resolved
id (`loop0/0.2/0:gdn`) replaced by a new call. The id is the block's path through the program
(`passes/resolve.py`): `loop<i>` enters the loop at item i, `<i>.<c>` copy c of the `repeat` or
`* n` at item i, `<i>:<kinds>` the call at item i; a `let` use is its bound item. A copy that holds
a chosen block is written out on its own and the untouched copies around it stay grouped, so
`gdn * 4` with copy 2 chosen becomes `gdn * 2; full; gdn`. Block order, and so every block's index
(`blocks.<i>`), is unchanged; the printer (`ir/printer.py`) writes the result.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import lookup
from lt2dsl.passes.overrides import as_node
from lt2dsl.passes.resolve import _expand_let

# Options a block call carries that are not the mixer's: kept from the replaced call.
BLOCK_ARGS = ("mlp", "norm")


def replace_blocks(program: n.Program, calls: dict[str, n.Call]) -> n.Program:
    """`program` with the blocks whose ids are the keys of `calls` replaced by those calls (kept
    `mlp=` / `norm=` arguments of the replaced call carry over)."""
    lets = {let.name: let.item for let in program.lets}
    targets = {tuple(block_id.split("/")): call for block_id, call in calls.items()}
    body, left = _stack(program.body, targets, lets)
    if left:
        raise ValueError(f"no block of the program has the id {', '.join(sorted('/'.join(k) for k in left))}")
    return program.model_copy(update={"body": tuple(body)})


def _stack(items: tuple, targets: dict[tuple, n.Call], lets: dict) -> tuple[list, dict]:
    """The rewritten items, and the targets none of them held."""
    out: list = []
    left = dict(targets)
    for i, item in enumerate(items):
        mine = {k: v for k, v in left.items() if _index(k[0]) == i}
        if not mine:
            out.append(item)
            continue
        for k in mine:
            del left[k]
        out += _item(item, mine, lets)
    return out, left


def _index(segment: str) -> int | None:
    head = segment.removeprefix("loop").split(":")[0].split(".")[0]
    return int(head) if head.isdigit() else None


def _item(item: n.Node, targets: dict[tuple, n.Call], lets: dict) -> list:
    if isinstance(item, n.Call) and item.name in lets:
        item = _expand_let(item, lets[item.name])
    first = next(iter(targets))[0]
    if ":" in first:
        (call,) = targets.values()
        return [_with_block_args(call, item)]
    if first.startswith("loop"):
        body, left = _stack(item.body, {k[1:]: v for k, v in targets.items()}, lets)
        _no_leftovers(left)
        return [item.model_copy(update={"body": tuple(body)})]
    return _copies(item, targets, lets)


def _copies(item: n.Repeat | n.Times, targets: dict[tuple, n.Call], lets: dict) -> list:
    """The copies of a `repeat` / `* n`, the ones holding targets rewritten, the others grouped."""
    body = item.body if isinstance(item, n.Repeat) else (item.item,)
    by_copy: dict[int, dict] = {}
    for k, call in targets.items():
        by_copy.setdefault(int(k[0].split(".")[1]), {})[k[1:]] = call
    out, run = [], 0
    for c in range(item.n):
        if c not in by_copy:
            run += 1
            continue
        out += _grouped(item, body, run)
        run = 0
        rewritten, left = _stack(body, by_copy[c], lets)
        _no_leftovers(left)
        out += rewritten
    return out + _grouped(item, body, run)


def _grouped(item: n.Repeat | n.Times, body: tuple, count: int) -> list:
    if count == 0:
        return []
    if count == 1:
        return list(body)
    return [item.model_copy(update={"n": count})]


def _no_leftovers(left: dict) -> None:
    if left:
        raise ValueError(f"no block of the program has the id {', '.join('/'.join(k) for k in left)}")


def _with_block_args(call: n.Call, replaced: n.Node) -> n.Call:
    if not isinstance(replaced, n.Call):
        raise ValueError("a `par` block cannot be replaced by one mixer")
    kept = tuple(a for a in replaced.args if a.name in BLOCK_ARGS)
    return call.model_copy(update={"args": call.args + kept, "comments": replaced.comments})


def mixer_call(mixer: n.Mixer, cfg: n.ModelConfig) -> n.Call:
    """The shortest call that resolves to `mixer` under `cfg`: the options whose value is not the
    default they would get."""
    spec = lookup(mixer.type)
    args, given, resolved = [], {}, {}
    for o in spec.options:
        if o.name not in mixer.opts:
            continue
        value = mixer.opts[o.name]
        if o.default_for(cfg, {**given, **resolved}) != value:
            args.append(n.Arg(name=o.name, value=value_node(value, o.type)))
            given[o.name] = value
        resolved[o.name] = value
    if mixer.label:
        args.append(n.Arg(name="name", value=n.Str(value=mixer.label)))
    return n.Call(name=mixer.type, args=tuple(args))


def value_node(v: Any, opt_type: str) -> n.Node:
    """A value node that reads back as `v` for an option of type `opt_type`."""
    if isinstance(v, Fraction):
        return n.Frac(num=v.numerator, den=v.denominator)
    if isinstance(v, str):
        return n.Str(value=v) if opt_type == "str" else n.Name(value=v)
    return as_node(v)
