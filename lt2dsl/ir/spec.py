"""`LayerSpec`: everything lt2dsl knows about one layer kind, as data.

A spec holds the option schema (types, defaults, ranges, docs) that validation checks and the
docs are generated from, the parameter tensors the lowered module creates (`weights`), the cache
tensors it allocates at decode (`cache`), and the closed-form FLOP formulas of the estimate. The
registry never imports torch: `module` is an import path resolved only by lowering.

Symbols used in every formula docstring: D = model dim, H = (query/key) heads, HV = value heads,
HKV = kv heads, K = key head dim, V = value head dim, d = attention head dim, L = context length,
t = position, C = chunk size (64), W = short-conv width, B = batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from lt2dsl.dtypes import Dtypes
from lt2dsl.ir.nodes import ModelConfig

OptType = Literal["int", "float", "bool", "enum", "str", "size", "number", "mlp", "norm"]
Opts = Mapping[str, Any]


@dataclass(frozen=True)
class Option:
    """One option of a layer kind (or a model setting, or a loop option).

    `default` is a value, or a callable `(cfg, opts) -> value` for defaults that depend on the
    model or on other options (e.g. `kv_heads` defaults to `heads`). Ranges are inclusive unless
    `min_open` / `max_open`.
    """

    name: str
    type: OptType
    doc: str
    default: Any = None
    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False
    choices: tuple[str, ...] = ()
    positional: bool = False  # the one value a call may pass without a name
    required: bool = False

    def default_for(self, cfg: ModelConfig | None, opts: Opts) -> Any:
        return self.default(cfg, opts) if callable(self.default) else self.default

    def range_text(self) -> str:
        """Human form of the valid range, e.g. `an integer >= 1` or one of `a`, `b`."""
        if self.type == "enum":
            return "one of " + ", ".join(f"`{c}`" for c in self.choices)
        kind = {
            "int": "an integer",
            "size": "an integer",
            "bool": "`true` or `false`",
            "str": "a string",
        }.get(self.type, "a number")
        lo = None if self.min is None else f"{'>' if self.min_open else '>='} {_num(self.min)}"
        hi = None if self.max is None else f"{'<' if self.max_open else '<='} {_num(self.max)}"
        parts = [p for p in (lo, hi) if p]
        return kind + (" " + " and ".join(parts) if parts else "")

    def coerce(self, x: Any) -> Any:
        """The Python value a resolved option holds: a `float` option written as a fraction
        (`33/2`) or an integer becomes a float, which torch takes; a `number` keeps its exact
        value (a fraction stays one), since derived widths are computed from it with `scaled`."""
        if self.type == "float" and isinstance(x, int | Fraction) and not isinstance(x, bool):
            return float(x)
        return x

    def in_range(self, x: float) -> bool:
        if self.min is not None and (x < self.min or (self.min_open and x == self.min)):
            return False
        return not (self.max is not None and (x > self.max or (self.max_open and x == self.max)))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class CacheTensor:
    """One decode-cache tensor of a mixer, per (iteration, block).

    `role` is "state" (fixed size: recurrent state, conv buffers) or "kv" (grows with L: KV
    caches, ring buffers capped at the window, index keys, cached inputs). `dtype` names which
    dtype setting it follows: "state" (state_dtype), "kv" (kv dtype) or "act" (activations).
    """

    shape: tuple[int, ...]
    role: Literal["state", "kv"]
    dtype: Literal["state", "kv", "act"]

    def nbytes(self, dt: Dtypes) -> int:
        """Bytes of the tensor in the resolved dtypes `dt`."""
        return math.prod(self.shape) * dt.nbytes(self.dtype)


@dataclass(frozen=True)
class Flops:
    """Forward FLOPs per token of one mixer (2 per multiply-add), split for the report."""

    proj: float  # projections, convs, gate MLPs: position-wise work
    core: float  # the token-mixing part (attention scores, recurrences, FFTs)

    @property
    def total(self) -> float:
        return self.proj + self.core


Mode = Literal["prefill", "decode"]


@dataclass(frozen=True)
class FromAttention:
    """Where one mixer weight starts when a student is initialised from a softmax-attention
    teacher (`lt2dsl/distill`): the teacher's weight `source` (`q_proj.weight`, ...), whose heads
    lie along `axis` (0: the output features of q/k/v, 1: the inputs of the output projection),
    repeated to the count this kind's option `heads` names (`heads`, `v_heads`, `kv_heads`) — GQA's
    shared k/v heads become one per student head. The head dims must agree. `heads=None` copies a
    tensor without heads (a norm weight, o_proj's bias) as it is.
    """

    source: str
    heads: str | None
    axis: int = 0


@dataclass(frozen=True)
class LayerSpec:
    """A layer kind. Subclasses (one file per kind in `lt2dsl/ir/specs/`) fill in the formulas."""

    kind: str
    summary: str
    options: tuple[Option, ...]
    module: str  # "lt2dsl.lowering.layers.gdn:GatedDeltaNet", imported lazily by lowering
    aliases: tuple[str, ...] = ()
    source: str = ""  # where the math and parameterization come from (mixers.md section)
    # Whether this kind's token mixing is bounded (a window) for the receptive-field figure.
    doc_extra: str = ""
    kernel_note: Callable[[Opts, ModelConfig], str | None] | None = field(default=None, compare=False)
    # Checkpoint import (`lt2dsl/hf`): the mixer's weight names in Hugging Face / fla checkpoints
    # (relative to the layer's mixer prefix, e.g. `self_attn.`) → its own `weights()` names; None
    # drops a stored tensor that is not a parameter (a saved rotary buffer).
    hf_map: Mapping[str, str | None] = field(default_factory=dict, compare=False)
    # Distillation (`lt2dsl/distill`): the mixer's weights that start from a softmax-attention
    # teacher's (its own name → `FromAttention`); the others keep their `reset_parameters` values.
    # Empty: the kind cannot start from attention.
    from_attention: Mapping[str, FromAttention] = field(default_factory=dict, compare=False)

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)

    # ---- formulas (overridden per kind) ----------------------------------------------------
    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Parameter tensors of the mixer (name -> shape), block norms and MLP excluded."""
        raise NotImplementedError

    def params(self, o: Opts, cfg: ModelConfig) -> int:
        return sum(math.prod(s) for s in self.weights(o, cfg).values())

    def cache(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """Decode cache tensors after L tokens for `batch` sequences."""
        raise NotImplementedError

    def flops(self, o: Opts, cfg: ModelConfig, L: int, mode: Mode, causal: str = "exact") -> Flops:
        """Forward FLOPs per token: mean over a prefill of L tokens, or one decode step at context L."""
        raise NotImplementedError

    def decode_read(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """The part of each growing ("kv") cache tensor one decode step at context L reads: all of
        it unless the kind addresses a subset (top-k keys, selected blocks)."""
        return {k: t for k, t in self.cache(o, cfg, batch, L).items() if t.role == "kv"}

    def prefill_gather(self, o: Opts, cfg: ModelConfig, L: int) -> float:
        """Cached key/value elements one query of a prefill of L tokens gathers for itself alone
        (mean over the queries): 0 for tiled attention, which reads each k/v tile once for a block of
        queries, and for recurrences; a token-level selection (top-k keys) reads its own."""
        return 0.0

    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """Kernels one application of the mixer launches in lt2dsl's decode step (the step
        `generate` replays as a CUDA graph) at context L for `batch` rows: its in-projection (one
        GEMM however many projections read the normed input), its own kernels and torch ops, its
        output projection. The block's norms and MLP are the block's (`block_decode_kernels`);
        work the step does once for every application is `decode_once`'s. The estimate charges
        each kernel the card's `kernel_s`; `tests/cost/test_decode_kernels.py` holds every kind's
        count to the launches of its lowered decode step."""
        raise NotImplementedError(f"`{self.kind}` has no decode kernel count")

    def decode_once(self, o: Opts, cfg: ModelConfig) -> dict[tuple, int]:
        """Kernels the decode step launches once, for the first application that needs them, and
        shares with the others (a RoPE table's rows at the step's positions, the attention
        lengths), keyed by what they compute: the estimate counts each key once a step."""
        return {}

    def backward_factor(self, o: Opts) -> float:
        """Training = forward × (1 + backward_factor); 2 unless the kind's spec says otherwise."""
        return 2.0

    def window(self, o: Opts) -> int | None:
        """Look-back added per application (w − 1 for a window of w keys), None when unbounded."""
        return None

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        """Elements per token one application of the mixer keeps for backward (no recomputation) at 2
        bytes an element (an fp32 value counts twice), beyond what the block counts for it: its
        pre-norm and the normed input its projections read (`cost.estimate.block_activations`).
        Every kind derives its own from what its lowering and kernels save; this default is a rough
        4·D for a kind that does not."""
        return 4 * cfg.dim

    def kept_outputs(self, o: Opts, cfg: ModelConfig) -> int:
        """Elements per token (2 bytes an element, fp32 twice) of the attention forward ops' outputs,
        o `[T, H, d]` and the fp32 log-sum-exp `[T, H]` per op, that selective per-application
        checkpointing keeps instead of recomputing (`training.checkpoint_keep = ["attention"]`,
        `train/parallel.py`): 0 for kinds that call no attention op."""
        return 0

    def is_delta_rule(self) -> bool:
        return False


def frac_to_number(x: Any) -> Any:
    return float(x) if isinstance(x, Fraction) else x


def exact(x: Any) -> Fraction:
    """An option value as an exact fraction (floats by their shortest decimal form, `0.3` → 3/10)."""
    return Fraction(repr(x)) if isinstance(x, float) else Fraction(x)


def scaled(width: int, factor: Any) -> int:
    """`width · factor` as an integer, computed exactly: `100 · 0.57` is 57 (a float product
    would truncate 56.99… to 56). The validator (E0503, E0504) requires it to be whole."""
    return int(exact(width) * exact(factor))


def show(x: Any) -> str:
    """`37.5` for a short decimal, `100/3` for a fraction that has none."""
    x = exact(x)
    if x.denominator == 1:
        return str(x.numerator)
    d = x.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    return f"{float(x):g}" if d == 1 and len(f"{float(x):g}") < 10 else f"{x.numerator}/{x.denominator}"
