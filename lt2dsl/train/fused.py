"""The training forward through the fused lowering, one block at a time.

`lt2dsl.compile` fuses the whole model's traced graph; the trainer needs every block application
to stay a module call (FSDP2's per-block hooks gather a block's weights, activation checkpointing
recomputes one application). `fuse_blocks` gives each block the forward the lowering makes of it:
the block traced as `lowering.to_fx` traces it (`LoweringTracer`), rewritten by every rule of
`lowering.fx_passes`, and that graph's code bound to the block itself. The code reads every
parameter and submodule through `self` when it runs (never a copy taken at trace time), so FSDP2's
gathered weights, a `requires_grad` change or an optimizer step are seen as in the eager block.

What the whole-model graph fuses and a block's graph cannot: the residual add that ends one block
with the next block's pre-norm (`add_rmsnorm` across the boundary), and the concatenated
projection weights built once per forward instead of once per application.
"""

from __future__ import annotations

import itertools
import linecache
from collections.abc import Callable

import torch
import torch.fx
from torch import nn

from lt2dsl.lowering.blocks import ResidualBlock

_NAMES = itertools.count()


class FusedBlock(ResidualBlock):
    """A `ResidualBlock` whose forward runs its fused graph's code (`fused_code`).

    Same parameters and names, same `forward(h [B, T, D], entry, pos, cu_seqlens) -> [B, T, D]`.
    While `torch.fx` traces the block (`LT2Model`'s own graph of a trained model) it is written
    out unfused, so the model's graph and its fusion passes see the block as lowering built it.
    The code is made again on first use after `.to()` / pickling / `copy.deepcopy`.
    """

    def forward(self, h: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        if isinstance(h, torch.fx.Proxy):
            return super().forward(h, entry, pos, cu_seqlens)
        code = self.__dict__.get("_fused")
        if code is None:
            code = self.__dict__["_fused"] = fused_code(self)
        return code(self, h, entry, pos, cu_seqlens)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.__dict__["_fused"] = None  # dtypes the trace read may have changed
        return out

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fused": None}


def fuse_blocks(blocks: nn.ModuleList, fused: bool = True) -> dict[str, int]:
    """Make every block of `blocks` a `FusedBlock` and trace its code now (`fused=False`: plain
    `ResidualBlock`s again), in place, parameters untouched. Returns how often each fusion rule
    fired, summed over the blocks."""
    from lt2dsl.lowering.fx_passes import COUNTERS

    fired = dict.fromkeys(COUNTERS, 0)
    for block in blocks:
        if type(block) not in (ResidualBlock, FusedBlock):
            # a subclass (FSDP's, after `fully_shard`) would lose its own class in the swap
            raise TypeError(
                f"fuse_blocks takes lowering's ResidualBlocks before any wrapping, got {type(block).__name__}"
            )
        block.__class__ = FusedBlock if fused else ResidualBlock
        block.__dict__.pop("_fused", None)
        if not fused:
            continue
        block.__dict__["_fused"] = fused_code(block)
        for rule, n in COUNTERS.items():
            fired[rule] += n
    return fired


def fused_code(block: ResidualBlock) -> Callable:
    """`forward(self, h, entry, pos, cu_seqlens)`: the code of `block`'s graph after the fusion
    passes, its attribute reads rooted at `self` (the block)."""
    from lt2dsl.lowering.fx_passes import fuse
    from lt2dsl.lowering.to_fx import LoweringTracer

    graph = LoweringTracer().trace(block)
    gm = torch.fx.GraphModule(block, graph)
    fuse(gm)
    _check_rooted(block, gm.graph)
    return _function(gm.graph.python_code(root_module="self"), type(block).__name__)


def _check_rooted(block: nn.Module, graph: torch.fx.Graph) -> None:
    """Every attribute the graph reads exists on `block` itself (a constant the tracer or a rule
    kept on the GraphModule alone would be missing when the code runs on the block)."""
    for node in graph.nodes:
        if node.op not in ("get_attr", "call_module"):
            continue
        owner = block
        for part in node.target.split("."):
            if not hasattr(owner, part):
                raise RuntimeError(f"the fused graph of a block reads `{node.target}`, which the block lacks")
            owner = getattr(owner, part)


def _function(code, name: str) -> Callable:
    """The generated `forward` as a function; its source registered with `linecache`, so a
    traceback through it shows the fused graph's lines."""
    filename = f"<lt2dsl fused {name} {next(_NAMES)}>"
    linecache.cache[filename] = (len(code.src), None, code.src.splitlines(keepends=True), filename)
    namespace = dict(code.globals)
    exec(compile(code.src, filename, "exec"), namespace)  # torch.fx's generated code, as GraphModule runs it
    return namespace["forward"]
