"""`baseline`: the same model with every mixer replaced by `full` — the standard looped
transformer the LT2 work compares against (`--vs baseline`)."""

from __future__ import annotations

from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import lookup

NAME = "baseline"


def to_baseline(model: n.Model) -> n.Model:
    cfg = model.config
    return model.model_copy(
        update={
            "config": cfg.model_copy(update={"name": f"{cfg.name}:baseline"}),
            "body": tuple(_stage(s, cfg) for s in model.body),
        }
    )


def _stage(s, cfg: n.ModelConfig):
    if isinstance(s, n.LoopBlock):
        return s.model_copy(update={"body": tuple(_stage(x, cfg) for x in s.body)})
    return s.model_copy(update={"mixers": (_full(cfg, s.span),), "id": s.id.rsplit(":", 1)[0] + ":full"})


def _full(cfg: n.ModelConfig, span) -> n.Mixer:
    spec = lookup("full")
    opts: dict = {}
    for o in spec.options:
        if o.name not in ("mlp", "norm", "name"):
            opts[o.name] = o.default_for(cfg, opts)
    return n.Mixer(type="full", opts=opts, span=span)
