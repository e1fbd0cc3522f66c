"""`tmm`: Toeplitz MLP mixer, causal token mixing by FFT (mixers.md §13)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import CacheTensor, Flops, LayerSpec, Mode, Option, Opts
from lt2dsl.ir.specs.common import lin, proj_flops


def _max_len(cfg: ModelConfig | None, o: Opts) -> int | None:
    return cfg.max_len if cfg else None


def fft_size(L: int) -> int:
    """N_fft: the next power of two ≥ 2L, so the circular product never wraps around."""
    return 1 << max(1, math.ceil(math.log2(2 * L)))


@dataclass(frozen=True)
class TmmSpec(LayerSpec):
    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """in_proj, the cached Toeplitz product (torch ops around one GEMM), out_proj."""
        return 19

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Toeplitz kernels w (kernel, heads, n) and position bias (heads, n), n = max_len;
        with heads > 1 also in_proj and out_proj (D, D) with biases (multi-head TMM)."""
        n, h, D = o["max_len"], o["heads"], cfg.dim
        w = {"w": (o["kernel"], h, n), "bias": (h, n)}
        if h > 1:
            w |= {
                "in_proj.weight": lin(D, D),
                "in_proj.bias": (D,),
                "out_proj.weight": lin(D, D),
                "out_proj.bias": (D,),
            }
        return w

    def cache(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """No finite state: the mixer inputs x_1..x_L, (B, L, D) in the activation dtype."""
        return {"x": CacheTensor((batch, L, cfg.dim), "kv", "act")}

    def flops(self, o: Opts, cfg: ModelConfig, L: int, mode: Mode, causal: str = "exact") -> Flops:
        """Per channel per token: prefill 10·log2(N_fft) + 6·kernel (rfft + irfft + products),
        decode 2·L·kernel (a dot product over the cached inputs per tap)."""
        D, k = cfg.dim, o["kernel"]
        proj = proj_flops(self.weights(o, cfg), ["in_proj.weight", "out_proj.weight"])
        if mode == "decode":
            core = 2.0 * L * k
        else:
            core = 10 * math.log2(fft_size(L)) + 6 * k
        return Flops(proj=proj, core=float(D * core))

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        """With heads > 1, in_proj's output (the Toeplitz op's input) and out_proj's input `[T, D]`;
        one head mixes the normed block input itself (counted by the block) and keeps nothing more."""
        return 2 * cfg.dim if o["heads"] > 1 else 0


SPEC = TmmSpec(
    kind="tmm",
    summary="Toeplitz MLP mixer: causal Toeplitz token mixing computed by FFT in O(n log n)",
    options=(
        Option(
            "heads", "int", "Toeplitz heads (channels split into groups with own kernels)", default=1, min=1
        ),
        Option(
            "head_dim",
            "int",
            "unused by tmm (channels per head = dim / heads)",
            default=lambda c, o: c.dim // o.get("heads", 1) if c else 1,
            min=1,
        ),
        Option("mlp", "mlp", "channel mixer of this block"),
        Option("norm", "norm", "block norm"),
        Option("name", "str", "a label for reports"),
        Option("kernel", "int", "taps k: output channel c mixes input channels c−k+1 … c", default=1, min=1),
        Option("max_len", "size", "longest sequence (kernel length n)", default=_max_len, min=1),
    ),
    module="lt2dsl.lowering.layers.tmm:ToeplitzMixer",
    source="mixers.md §13 (arXiv 2605.06683; block structure from the author's prototype code)",
)
