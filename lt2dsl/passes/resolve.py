"""`resolve`: surface `Program` → resolved `Model` (lets expanded, copies unrolled, defaults filled).

The pass assumes a program that validation accepted; it never reports problems itself (an
unexpected shape here is an internal error, not a user diagnostic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import lookup
from lt2dsl.ir.settings import MODEL_SETTINGS
from lt2dsl.ir.specs.channel import swiglu_hidden
from lt2dsl.passes.values import py

NAME = "resolve"


def resolve(prog: n.Program) -> n.Model:
    """Resolve `prog` (its `--set` overrides already applied, `passes/overrides.py`)."""
    cfg = model_config(prog)
    lets = {let.name: let.item for let in prog.lets}
    body = _stages(prog.body, cfg, lets, "")
    return n.Model(config=cfg, body=tuple(body), span=prog.span)


# ---- model settings ---------------------------------------------------------------------------


def setting_values(prog: n.Program) -> dict[str, Any]:
    known = {o.name for o in MODEL_SETTINGS}
    return {s.name: s.value for s in prog.settings if s.name in known}


# The settings' own defaults (`dtype`, `vocab`, `max_len`, ...), for those a program leaves out.
DEFAULTS = {o.name: o.default for o in MODEL_SETTINGS if o.default is not None}


def model_config(prog: n.Program) -> n.ModelConfig:
    raw = setting_values(prog)
    val = DEFAULTS | {k: py(v) for k, v in raw.items() if not isinstance(v, n.Call)}
    dim = int(val["dim"])
    heads = int(val.get("heads") or max(1, dim // 128))
    head_dim = int(val.get("head_dim") or dim // heads)
    hidden = None
    mlp = mlp_spec(raw.get("mlp"), dim, hidden)
    return n.ModelConfig(
        name=prog.name or _file_stem(prog),
        dim=dim,
        vocab=int(val["vocab"]),
        heads=heads,
        head_dim=head_dim,
        kv_heads=int(val.get("kv_heads") or heads),
        mlp=mlp,
        norm=norm_spec(raw.get("norm")),
        max_len=int(val["max_len"]),
        tie_embeddings=bool(val["tie_embeddings"]),
        embed_scale=bool(val["embed_scale"]),
        head=val["head"] not in (None, "none"),
        dtype=str(val["dtype"]),
        state_dtype=str(val["state_dtype"]),
        span=prog.span,
    )


def _file_stem(prog: n.Program) -> str:
    """A bare body has no model name: call it after its file, as a user would."""
    f = prog.span.file
    if prog.span.known and f and not f.startswith("<"):
        return Path(f).stem
    return "model"


def _call_parts(v: n.Node | None) -> tuple[str | None, dict[str, Any]]:
    """(name, {option: value}) of a value that names a kind: `swiglu`, `swiglu(hidden=..)`, `none`."""
    if v is None:
        return None, {}
    if isinstance(v, n.Call):
        args = {}
        for a in v.args:
            args[a.name or "_"] = py(a.value)
        return v.name, args
    if isinstance(v, n.NoneVal):
        return "none", {}
    return str(py(v)), {}


def mlp_spec(v: n.Node | None, dim: int, _hidden: int | None = None) -> n.MlpSpec:
    name, args = _call_parts(v)
    name = name or "swiglu"
    if name == "none":
        return n.MlpSpec(type="none", hidden=0)
    hidden = args.get("hidden", args.get("_"))
    if hidden is None:
        hidden = swiglu_hidden(dim) if name in ("swiglu", "geglu") else 4 * dim
    return n.MlpSpec(type=name, hidden=int(hidden))


def norm_spec(v: n.Node | None, base: n.NormSpec | None = None) -> n.NormSpec:
    name, args = _call_parts(v)
    if name is None:
        return base or n.NormSpec()
    if name == "sandwich":
        b = base or n.NormSpec()
        return b.model_copy(update={"sandwich": True})
    eps = args.get("eps", args.get("_"))
    default_eps = 1e-6 if name == "rmsnorm" else 1e-5
    return n.NormSpec(
        type=name,
        eps=float(eps if eps is not None else default_eps),
        sandwich=bool(base and base.sandwich),
        offset=bool(args.get("offset", False)),
    )


# ---- the body ---------------------------------------------------------------------------------


def _stages(items: tuple, cfg: n.ModelConfig, lets: dict, prefix: str) -> list:
    """Resolve a stack. Ids are paths: `loop0/2:gdn` is item 2 of the loop at top-level index 0;
    copies of `repeat` / `*` add `<index>.<copy>/`, e.g. `loop0/0.3/1:dsa`."""
    out: list = []
    for i, item in enumerate(items):
        out += _item(item, cfg, lets, prefix, i)
    return out


def _item(item: n.Node, cfg: n.ModelConfig, lets: dict, prefix: str, i: int) -> list:
    match item:
        case n.Call() if item.name in lets:
            return _item(_expand_let(item, lets[item.name]), cfg, lets, prefix, i)
        case n.Call():
            return [_block([item], cfg, f"{prefix}{i}")]
        case n.Par():
            calls = [_expand_let(c, lets[c.name]) if c.name in lets else c for c in item.calls]
            return [_block(calls, cfg, f"{prefix}{i}", span=item.span)]
        case n.Loop():
            return [_loop(item, cfg, lets, f"{prefix}loop{i}")]
        case n.Repeat():
            return _copies(item.body, item.n, cfg, lets, f"{prefix}{i}")
        case n.Times():
            return _copies((item.item,), item.n, cfg, lets, f"{prefix}{i}")
    raise AssertionError(f"internal error in pass `{NAME}`: unexpected node {item!r}")


def _expand_let(use: n.Call, bound: n.Node) -> n.Node:
    """A let use expands to the bound item; options on the use override a bound call's options."""
    if not use.args or not isinstance(bound, n.Call):
        return bound
    names = {a.name for a in use.args}
    kept = tuple(a for a in bound.args if a.name not in names)
    return bound.model_copy(update={"args": kept + use.args, "span": use.span})


def _copies(body: tuple, count: int, cfg: n.ModelConfig, lets: dict, path: str) -> list:
    out = []
    for c in range(count):
        out += _stages(body, cfg, lets, f"{path}.{c}/")
    return out


def _loop(loop: n.Loop, cfg: n.ModelConfig, lets: dict, loop_id: str) -> n.LoopBlock:
    opts = {a.name: a.value for a in loop.options if a.name}
    exit_v = opts.get("exit")
    exit_gate = None
    if isinstance(exit_v, n.Call) and exit_v.name == "gate":
        thr = next((py(a.value) for a in exit_v.args if a.name in ("threshold", None)), 0.9)
        exit_gate = n.ExitGate(threshold=float(thr), span=exit_v.span)
    elif isinstance(exit_v, n.Name) and exit_v.value == "gate":
        exit_gate = n.ExitGate(span=exit_v.span)
    inject = py(opts["inject"]) if "inject" in opts else "none"
    # A loop-level `norm=sandwich` applies to its blocks (language.md §4).
    inner_cfg = cfg
    if "norm" in opts:
        inner_cfg = cfg.model_copy(update={"norm": norm_spec(opts["norm"], cfg.norm)})
    body = _stages(loop.body, inner_cfg, lets, f"{loop_id}/")
    return n.LoopBlock(
        id=loop_id,
        T=loop.T,
        final_norm=bool(py(opts["final_norm"])) if "final_norm" in opts else False,
        inject="none" if inject is None else inject,
        exit=exit_gate,
        body=tuple(body),
        span=loop.span,
    )


def _block(calls: list[n.Call], cfg: n.ModelConfig, path: str, span=None) -> n.Block:
    mixers = [_mixer(c, cfg) for c in calls]
    mlp, norm = cfg.mlp, cfg.norm
    for c in calls:
        if (m := c.arg("mlp")) is not None:
            mlp = mlp_spec(m.value, cfg.dim)
        if (nm := c.arg("norm")) is not None:
            norm = norm_spec(nm.value, cfg.norm)
    kinds = "+".join(m.type for m in mixers)
    return n.Block(id=f"{path}:{kinds}", mixers=tuple(mixers), mlp=mlp, norm=norm, span=span or calls[0].span)


def _mixer(call: n.Call, cfg: n.ModelConfig) -> n.Mixer:
    spec = lookup(call.name)
    assert spec is not None, f"internal error in pass `{NAME}`: unknown kind {call.name}"
    given: dict[str, Any] = {}
    positional = next((o.name for o in spec.options if o.positional), None)
    for a in call.args:
        given[a.name or positional] = py(a.value)
    label = given.pop("name", None)
    given.pop("mlp", None)
    given.pop("norm", None)
    opts: dict[str, Any] = {}
    for o in spec.options:
        if o.name in ("mlp", "norm", "name"):
            continue
        opts[o.name] = o.coerce(given[o.name]) if o.name in given else o.default_for(cfg, {**given, **opts})
    return n.Mixer(type=spec.kind, opts=opts, label=label, span=call.span)


def blocks(stages) -> list[tuple[n.Block, int]]:
    """Every block with its iteration count (product of enclosing loops' T), in order."""
    out: list[tuple[n.Block, int]] = []

    def walk(ss, mult):
        for s in ss:
            if isinstance(s, n.LoopBlock):
                walk(s.body, mult * s.T)
            else:
                out.append((s, mult))

    walk(stages, 1)
    return out


def ends_with_normed_loop(stages) -> bool:
    """A body whose last stage is a `final_norm=true` loop already ends with the final norm."""
    return bool(stages) and isinstance(stages[-1], n.LoopBlock) and stages[-1].final_norm


def final_norm_applications(stages) -> int:
    """How often one forward applies the model's final norm: after every iteration of each
    `final_norm=true` loop (its T times the enclosing loops' T), and once after the body unless
    the body ends with such a loop."""
    count = 0 if ends_with_normed_loop(stages) else 1

    def walk(ss, mult):
        nonlocal count
        for s in ss:
            if isinstance(s, n.LoopBlock):
                count += mult * s.T if s.final_norm else 0
                walk(s.body, mult * s.T)

    walk(stages, 1)
    return count


def loops(stages) -> list[n.LoopBlock]:
    """Loops outer before inner, in order. Index k names `loops.<k>` — the estimate's parameter
    names and the lowered module's submodules both come from this one order."""
    out: list[n.LoopBlock] = []
    for s in stages:
        if isinstance(s, n.LoopBlock):
            out += [s, *loops(s.body)]
    return out
