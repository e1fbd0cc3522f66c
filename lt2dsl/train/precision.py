"""bf16 compute weights over fp32 master weights for a model that FSDP2 does not shard.

FSDP2's `MixedPrecisionPolicy(param_dtype=bf16)` runs every block on bf16 copies of its weights;
`ParamCast` does the same for one process (and DDP): while the training forward runs, every
parameter a module reads is its bf16 cast, made once per forward and kept until the next one, so
a looped block's applications and activation checkpointing's recomputations in backward read the
same copies (2 bytes per parameter: the estimate's `copies`). The casts are differentiable, so
gradients accumulate into the fp32 masters, which the optimizer, the clipping and checkpoints see
as ever (between forwards every module holds its masters again).

Why not autocast: it casts the inputs of aten's matmuls only. The weights the other ops read (norm
gains, gates, conv taps) stay fp32 and promote the residual stream and the norms to fp32, and the
fused ops of the lowering (`kernels.fused`), which take one dtype for their inputs and weights,
fall back to their unfused reference forms — keeping fp32 intermediates for backward.

    cast = ParamCast(tm, torch.bfloat16)   # hooks on every block of `tm`
    with cast.forward():                   # the model's own weights: embedding, final norm, head
        h = tm(input_ids)                  # each block swaps its weights in and out around its call
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

# (module, parameter name, the fp32 master Parameter)
Slot = tuple[nn.Module, str, nn.Parameter]


def slots(root: nn.Module, skip: tuple[nn.Module, ...] = ()) -> list[Slot]:
    """Every parameter held by `root` or its submodules, except those inside `skip`'s modules."""
    inside = {id(m) for s in skip for m in s.modules()}
    out = []
    for m in root.modules():
        if id(m) in inside:
            continue
        out += [(m, name, p) for name, p in m._parameters.items() if p is not None]
    return out


class ParamCast:
    """The forward's bf16 (or any `dtype`) weight copies of `model` (module docstring).

    `model` has `blocks` (an `nn.ModuleList`): each block swaps its own weights in before its call
    and back after it (forward hooks, so a recomputation in backward does too); `forward()` swaps
    the rest of the model's weights for one forward and starts that forward's copies afresh.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        self.dtype = dtype
        self.copies: dict[int, torch.Tensor] = {}
        blocks = tuple(model.blocks)
        self.root = slots(model, skip=blocks)
        self.handles = []
        for block in blocks:
            own = slots(block)
            self.handles.append(block.register_forward_pre_hook(lambda m, a, own=own: self.swap_in(own)))
            self.handles.append(
                block.register_forward_hook(lambda m, a, o, own=own: self.swap_out(own), always_call=True)
            )

    def cast(self, p: nn.Parameter) -> torch.Tensor:
        """`p` in the compute dtype, made once per forward (a non-floating or already narrow `p`
        is used as it is)."""
        if not p.is_floating_point() or p.dtype == self.dtype:
            return p
        c = self.copies.get(id(p))
        if c is None:
            c = self.copies[id(p)] = p.to(self.dtype)
        return c

    def swap_in(self, own: list[Slot]) -> None:
        for m, name, p in own:
            m._parameters[name] = self.cast(p)

    @staticmethod
    def swap_out(own: list[Slot]) -> None:
        for m, name, p in own:
            m._parameters[name] = p

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """One forward: new copies (the masters may have stepped), the non-block weights swapped
        in for its duration."""
        self.copies.clear()
        self.swap_in(self.root)
        try:
            yield
        finally:
            self.swap_out(self.root)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
