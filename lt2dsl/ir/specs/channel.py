"""Channel mixers (values of `mlp`) and norms (values of `norm`)."""

from __future__ import annotations

import math
from fractions import Fraction

from lt2dsl.ir.nodes import MlpSpec, NormSpec
from lt2dsl.ir.spec import Option
from lt2dsl.ir.specs.common import CAT_ALIGN, lin


def swiglu_hidden(dim: int) -> int:
    """8/3 · dim rounded up to a multiple of 256 (LLaMA's rule): 2048 → 5632."""
    return 256 * math.ceil(Fraction(8, 3) * dim / 256)


MLP_KINDS = {
    "swiglu": (
        Option(
            "hidden",
            "size",
            "hidden width [8/3·dim, rounded up to a multiple of 256]",
            min=1,
            positional=True,
        ),
    ),
    "geglu": (
        Option(
            "hidden",
            "size",
            "hidden width of the tanh-GELU gated MLP (Gemma) [8/3·dim, as swiglu]",
            min=1,
            positional=True,
        ),
    ),
    "gelu": (Option("hidden", "size", "hidden width [4·dim]", min=1, positional=True),),
}
NORM_KINDS = {
    "rmsnorm": (
        Option("eps", "float", "epsilon", default=1e-6, min=0, min_open=True, positional=True),
        Option("offset", "bool", "scale by (1 + weight) (Gemma)", default=False),
    ),
    "layernorm": (Option("eps", "float", "epsilon", default=1e-5, min=0, min_open=True, positional=True),),
    "sandwich": (),
}


def mlp_weights(m: MlpSpec, dim: int) -> dict[str, tuple[int, ...]]:
    """swiglu, geglu: gate/up (hidden, D), down (D, hidden); gelu: up, down; none: nothing. No biases."""
    if m.type in ("swiglu", "geglu"):
        return {
            "gate_proj.weight": lin(m.hidden, dim),
            "up_proj.weight": lin(m.hidden, dim),
            "down_proj.weight": lin(dim, m.hidden),
        }
    if m.type == "gelu":
        return {"up_proj.weight": lin(m.hidden, dim), "down_proj.weight": lin(dim, m.hidden)}
    return {}


def mlp_flops(m: MlpSpec, dim: int) -> float:
    return float(2 * sum(math.prod(s) for s in mlp_weights(m, dim).values()))


def norm_weights(n: NormSpec, dim: int) -> dict[str, tuple[int, ...]]:
    return {"weight": (dim,), "bias": (dim,)} if n.type == "layernorm" else {"weight": (dim,)}


def block_norm_count(n: NormSpec, has_mlp: bool) -> int:
    """Pre-norm: one norm before the mixer and one before the MLP; sandwich doubles both."""
    per_half = 2 if n.sandwich else 1
    return per_half * (2 if has_mlp else 1)


# Torch ops of one offset rmsnorm (`OffsetRMSNorm`, composite) with the residual add before it,
# and of one with no add (the model's first norm, a loop's final norm).
OFFSET_NORM_KERNELS = 14
OFFSET_LONE_NORM_KERNELS = 10


def norm_decode_kernels(n: NormSpec) -> int:
    """Kernels one residual add and the norm after it launch in a decode step: one for an rmsnorm
    (the fused add-norm kernel; sandwich's post-norm, add and pre-norm too), two for a layernorm
    (norm and add), the composite torch ops of an offset rmsnorm."""
    if n.type == "layernorm":
        return 2
    return OFFSET_NORM_KERNELS if n.offset else 1


def lone_norm_kernels(n: NormSpec) -> int:
    """Kernels of a norm with no residual add fused into it (the model's first or final norm)."""
    return OFFSET_LONE_NORM_KERNELS if n.offset and n.type == "rmsnorm" else 1


def block_decode_kernels(n: NormSpec, m: MlpSpec) -> int:
    """Kernels a block launches in a decode step beside its mixers' own (`decode_kernels`): the
    MLP (swiglu, gelu: the gate/up or up GEMM, the activation, down; geglu also its product) and an
    add-norm after the mixer and after the MLP (after the mixer alone with `mlp=none`). A
    `par(...)` block's mixers share one in-projection GEMM and sum their outputs with one add, so
    the block counts the sum of its mixers'."""
    mlp = {"swiglu": 3, "gelu": 3, "geglu": 4, "none": 0}[m.type]
    return mlp + norm_decode_kernels(n) * (1 if m.type == "none" else 2)


def mlp_activations(m: MlpSpec) -> int:
    """Elements per token the MLP keeps besides its normed input: swiglu the fused gate/up
    projection's output (padded to `CAT_ALIGN`) and down's input; geglu also the GELU's output;
    gelu up's output and down's input."""
    if m.type == "gelu":
        return 2 * m.hidden
    if m.type in ("swiglu", "geglu"):
        cat = -(-2 * m.hidden // CAT_ALIGN) * CAT_ALIGN
        return cat + m.hidden * (2 if m.type == "geglu" else 1)
    return 0


def norm_saved(channels: int, rows: int, composite: bool) -> int:
    """Elements per token one norm over `rows` groups of `channels` keeps for backward, at 2 bytes
    an element: fused (the add-norm kernel, LayerNorm, CUDA's `rms_norm`) its input in the compute
    dtype and an fp32 statistic per row, channels + 2·rows; composite (`OffsetRMSNorm`, and
    `nn.RMSNorm` off CUDA) the fp32 input and fp32 normed value, 4·channels + 2·rows."""
    return (4 if composite else 1) * channels + 2 * rows
