"""`torch.library.custom_op` whose plain eager calls skip the dispatcher.

Every lt2dsl kernel op is a registered custom op (fake implementation, autograd, FLOP formula), so
`torch.compile(fullgraph=True)`, `FlopCounterMode` and autograd see it. In plain eager inference
the dispatcher adds nothing but time: a decode step of `examples/lt2_hybrid_gdn_dsa.lt2` makes
~700 op calls, and with the kernels stubbed out the CPU spent 25–50 ms of a 165–190 ms step in
the dispatch alone (the decode steps measured on the H200 were host-bound at 130–190 ms).

`custom_op` registers the op exactly as `torch.library.custom_op` does and returns an `EagerOp`:
calling it runs the Python implementation directly when nothing can observe the difference, and
the registered op otherwise (`dispatch_needed`). Everything else (`register_fake`,
`register_autograd`, ...) is the registered op's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.flop_counter import register_flop_formula

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _observed(t: torch.Tensor, grad: bool) -> bool:
    """A tensor subclass (fake, functional, ...) or an input autograd must record."""
    return type(t) not in _PLAIN or (grad and t.requires_grad)


def _traced() -> bool:
    """Compiling, under a dispatch mode (fake tensors, `FlopCounterMode`) or with autocast on: the
    registered op must see the call."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return True
    return torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")


def eager_autograd_ok(*tensors) -> bool:
    """Whether a call may skip the registered op for a plain `torch.autograd.Function`: nothing
    traces it (`_traced`) and every tensor is plain (autograd may record it)."""
    return not _traced() and all(t is None or type(t) in _PLAIN for t in tensors)


def dispatch_needed(args: tuple, kwargs: dict) -> bool:
    """Whether a call must go through the registered op: under `torch.compile` or a dispatch mode
    (fake tensors, `FlopCounterMode`), with autocast on, for tensor subclasses, or when autograd
    must record it (grad enabled and an input requiring grad)."""
    if _traced():
        return True
    grad = torch.is_grad_enabled()
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, torch.Tensor):
            if _observed(a, grad):
                return True
        elif isinstance(a, list | tuple):
            ts = [t for t in a if isinstance(t, torch.Tensor)]
            if any(_observed(t, grad) for t in ts):
                return True
    return False


class EagerOp:
    """A registered custom op (`op`) and its Python implementation (`impl`); see the module doc."""

    def __init__(self, op, impl: Callable):
        self.op = op
        self.impl = impl

    def __call__(self, *args, **kwargs):
        if dispatch_needed(args, kwargs):
            return self.op(*args, **kwargs)
        return self.impl(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.op, name)


def custom_op(name: str, fn: Callable | None = None, /, *, mutates_args, **kwargs):
    """`torch.library.custom_op(name, fn, mutates_args=...)` (also as a decorator) as an `EagerOp`."""

    def register(impl: Callable) -> EagerOp:
        return EagerOp(torch.library.custom_op(name, impl, mutates_args=mutates_args, **kwargs), impl)

    return register if fn is None else register(fn)


def register_chunk_flops(fwd, bwd, flops: Callable[..., int]) -> None:
    """FLOP formulas of a chunked forward op and its backward: `flops(q_shape, v_shape)` for the
    forward, twice that for the backward (mixers.md §0: training ≈ 3× forward)."""

    def fwd_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
        return flops(q_shape, v_shape)

    def bwd_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * flops(q_shape, v_shape)

    register_flop_formula(fwd)(fwd_flops)
    register_flop_formula(bwd)(bwd_flops)
