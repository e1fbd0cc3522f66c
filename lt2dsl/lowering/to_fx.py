"""Resolved IR + instantiated modules → `torch.fx.GraphModule` (the graph `LT2Model` runs).

The forward below is written over the resolved structure (blocks, loops, their options) with
Python loops that unroll at trace time; a custom tracer records it. The graph then shows, per
(iteration, block): norm → projections → activations / convs → one core-op node → output norm /
gate → o_proj → residual add → norm → MLP → residual add, which is what the fusion passes
(`lowering/fx_passes`) rewrite. A loop calls the same submodules T times (same `call_module` targets), so
its weights are shared by construction.

Cache plumbing: placeholders `input_ids`, `cache` and `cu_seqlens` (both default None);
`cache_pos(cache)` once at the start, `cache_entry(cache, k)` for application k ((iteration,
block) pairs in execution order), `cache_advance(cache, T)` at the end. `cu_seqlens` (the
document starts of a packed row, `packed.py`) reaches every block and from there every mixer.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from lt2dsl.ir import nodes as n
from lt2dsl.lowering import functional as lf
from lt2dsl.lowering.leaf import LeafTracer
from lt2dsl.passes.resolve import ends_with_normed_loop
from lt2dsl.passes.resolve import loops as loops_preorder


class Unrolled(nn.Module):
    """The module the tracer records: the model's submodules under their parameter names and a
    forward over the resolved structure.

    Also runs eagerly where a trainer needs the blocks called as modules (FSDP's per-block hooks,
    activation checkpointing per application through `run_block`); `head=False` then returns
    the final hidden states `[B, T, D]` instead of logits.
    """

    def __init__(
        self,
        model: n.Model,
        embed: nn.Module,
        blocks: nn.ModuleList,
        loops: nn.ModuleList,
        final_norm: nn.Module,
        lm_head: nn.Module | None,
        head: bool = True,
    ):
        super().__init__()
        self.ir, self.with_head = model, head
        self.embed, self.blocks, self.loops, self.final_norm = embed, blocks, loops, final_norm
        if lm_head is not None:
            self.lm_head = lm_head
        self.block_index = {b.block_id: i for i, b in enumerate(blocks)}
        self.loop_index = {lp.id: k for k, lp in enumerate(loops_preorder(model.body))}

    def forward(self, input_ids: torch.Tensor, cache=None, cu_seqlens=None) -> torch.Tensor:
        """input_ids `[B, T]` → logits `[B, T, vocab]` (hidden states `[B, T, D]` with `head = none`
        or `head=False`)."""
        pos = lf.cache_pos(cache)
        e = self.embed(input_ids)
        if self.ir.config.embed_scale:
            # Gemma: × sqrt(dim) rounded to the activation dtype first, as its checkpoints expect
            e = e * torch.tensor(self.ir.config.dim**0.5, dtype=e.dtype)
        apps = itertools.count()
        h = self.stages(self.ir.body, e, e, (cache, pos, cu_seqlens), apps)
        if not ends_with_normed_loop(self.ir.body):
            h = self.final_norm(h)
        out = self.head(h) if self.with_head else h
        lf.cache_advance(cache, input_ids.shape[1])
        return out

    def head(self, h: torch.Tensor) -> torch.Tensor:
        cfg = self.ir.config
        if not cfg.head:
            return h
        if cfg.tie_embeddings:
            return F.linear(h, self.embed.weight)
        return self.lm_head(h)

    def stages(self, stages, h, e, run: tuple, apps: Iterator[int]) -> torch.Tensor:
        """`run` = (cache, pos, cu_seqlens) of this call."""
        for s in stages:
            if isinstance(s, n.LoopBlock):
                h = self.loop(s, h, e, run, apps)
            else:
                h = self.run_block(self.block_index[s.id], h, next(apps), run)
        return h

    def run_block(self, i: int, h: torch.Tensor, app: int, run: tuple) -> torch.Tensor:
        """Application `app` of block `i`: h `[B, T, D]` → `[B, T, D]` (a trainer's hook point)."""
        cache, pos, cu_seqlens = run
        return self.blocks[i](h, lf.cache_entry(cache, app), pos, cu_seqlens)

    def loop(self, lp: n.LoopBlock, h, e, run: tuple, apps: Iterator[int]) -> torch.Tensor:
        """T iterations of the body with shared weights (language.md §4, mixers.md §14)."""
        extras = self.loops[self.loop_index[lp.id]]
        hs, logits = [], []
        for t in range(lp.T):
            if t > 0 and lp.inject == "add":
                h = h + e
            elif t > 0 and lp.inject == "concat":
                h = extras.adapter(torch.cat([h, e], dim=-1))
            h = self.stages(lp.body, h, e, run, apps)
            if lp.final_norm:
                h = self.final_norm(h)
            if lp.exit is not None:
                logits.append(extras.exit(h))  # [B, T, 1]
                hs.append(h)
        if lp.exit is not None:
            h = extras.mix(hs, logits)
        return h


class LoweringTracer(LeafTracer):
    """Traces into blocks, MLPs and mixer layers; keeps torch.nn modules (Linear, Embedding,
    norms, convs), any module class named `*Norm` and `ExitMix` as leaves, and every `@leaf`
    function as one node (`lowering/leaf.py`)."""

    def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
        from lt2dsl.lowering.blocks import ExitMix

        if isinstance(m, ExitMix) or type(m).__name__.endswith("Norm"):
            return True
        return super().is_leaf_module(m, qualified_name)


def trace(module: nn.Module) -> torch.fx.GraphModule:
    """Trace `module` (a block, a layer) into a GraphModule sharing its submodules and parameters."""
    return torch.fx.GraphModule(module, LoweringTracer().trace(module))


def to_fx(root: Unrolled) -> torch.fx.GraphModule:
    """Trace `root` into a GraphModule that shares its submodules and parameters."""
    graph = LoweringTracer().trace(root)
    return torch.fx.GraphModule(root, graph, class_name="LT2Graph")
