"""Option groups and formula helpers shared by the layer specs."""

from __future__ import annotations

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import FromAttention, Option, Opts


def _heads(cfg: ModelConfig | None, o: Opts) -> int:
    return cfg.heads if cfg else 1


def _head_dim(cfg: ModelConfig | None, o: Opts) -> int:
    return cfg.head_dim if cfg else 64


def _kv_heads(cfg: ModelConfig | None, o: Opts) -> int:
    # An MHA model keeps MHA when a block overrides `heads`; a GQA model keeps its kv heads.
    if cfg is None or cfg.kv_heads == cfg.heads:
        return o.get("heads", cfg.heads if cfg else 1)
    return cfg.kv_heads


HEADS = Option("heads", "int", "number of (query/key) heads", default=_heads, min=1)
HEAD_DIM = Option("head_dim", "int", "dimension of one head", default=_head_dim, min=1)
COMMON = (
    HEADS,
    HEAD_DIM,
    Option("mlp", "mlp", "channel mixer of this block (`swiglu(...)`, `gelu(...)`, `none`)"),
    Option("norm", "norm", "block norm (`rmsnorm(eps)`, `layernorm(eps)`, `sandwich`)"),
    Option("name", "str", "a label for reports"),
)

ATTENTION = (
    Option("kv_heads", "int", "key/value heads (GQA); must divide `heads`", default=_kv_heads, min=1),
    Option(
        "gate",
        "enum",
        "output gate on SDPA (Qiu et al. 2025): elementwise `sdpa`, per-head `headwise`",
        default="none",
        choices=("none", "sdpa", "headwise"),
    ),
    Option("qk_norm", "bool", "per-head RMSNorm on q and k (Qwen3)", default=False),
    Option("rope_theta", "float", "RoPE base", default=10000.0, min=0, min_open=True),
    Option("bias", "bool", "biases on the q, k, v and o projections (LLaMA's attention_bias)", default=False),
)


def _rope_dim(cfg: ModelConfig | None, o: Opts) -> int:
    return o.get("head_dim", _head_dim(cfg, o))


# Options of `full` and `swa` that imported checkpoints need (Qwen2's q/k/v-only bias, Llama 3 and
# linear RoPE scaling, Qwen3-Next's partial RoPE); the RoPE math is `lowering/rope.py`'s.
ROPE_SCALINGS = ("none", "linear", "llama3")
ATTENTION_HF = (
    Option("qkv_bias", "bool", "biases on the q, k and v projections only (Qwen2)", default=False),
    Option(
        "rope_dim",
        "int",
        "leading dims of each head that RoPE rotates (partial RoPE) [head_dim]",
        default=_rope_dim,
        min=2,
    ),
    Option(
        "rope_scaling",
        "enum",
        "RoPE frequency scaling: `linear` (positions / factor) or `llama3` (by wavelength)",
        default="none",
        choices=ROPE_SCALINGS,
    ),
    Option("rope_factor", "float", "RoPE scaling factor", default=1.0, min=1),
    Option("rope_low_freq", "float", "`llama3`: low-frequency factor", default=1.0, min=0, min_open=True),
    Option("rope_high_freq", "float", "`llama3`: high-frequency factor", default=4.0, min=0, min_open=True),
    Option("rope_original_len", "size", "`llama3`: the pre-scaling context length", default=8192, min=1),
)

# Epsilon of the (gated) output RMSNorm of the fla-style recurrent mixers (fla's `norm_eps`).
NORM_EPS = Option("norm_eps", "float", "epsilon of the output RMSNorm", default=1e-5, min=0, min_open=True)

CONV = Option("conv", "int", "short causal depthwise conv width on q, k, v (0: none)", default=4, min=0)
V_HEADS = Option(
    "v_heads",
    "int",
    "value heads HV (grouped value heads when > heads)",
    default=lambda c, o: o.get("heads", _heads(c, o)),
    min=1,
)


# Rows of the one GEMM the `norm_proj` fusion makes of the projections that read a normed input
# are padded to a multiple of this (`kernels.fused.CAT_ALIGN`; a test holds the two equal).
CAT_ALIGN = 16


def cat_width(weights: dict[str, tuple[int, ...]], names: tuple[str, ...] | list[str]) -> int:
    """Columns of the fused projection's output `[T, width]` for the named input projections: their
    rows summed, padded to `CAT_ALIGN` when two or more are fused (one stays a plain linear). The
    split outputs are views of it, so one of them kept for backward keeps all of it."""
    rows = [weights[n][0] for n in names if n in weights]
    if len(rows) < 2:
        return sum(rows)
    return -(-sum(rows) // CAT_ALIGN) * CAT_ALIGN


def lin(n_out: int, n_in: int) -> tuple[int, int]:
    """Shape of an `nn.Linear(n_in, n_out)` weight."""
    return (n_out, n_in)


def qkv_weights(qk: int, v: int, D: int) -> dict[str, tuple[int, int]]:
    """The q, k `(qk, D)` and v `(v, D)` projections a linear-attention kind starts with."""
    return {"q_proj.weight": lin(qk, D), "k_proj.weight": lin(qk, D), "v_proj.weight": lin(v, D)}


def proj_flops(weights: dict[str, tuple[int, ...]], names: list[str]) -> float:
    """2 FLOPs per weight of each named matrix, once per token (a projection of one token)."""
    total = 0
    for n in names:
        if n in weights:
            s = weights[n]
            total += 2 * s[0] * s[1]
    return float(total)


def conv_flops(channels: int, width: int) -> float:
    """Depthwise causal conv: 2·W FLOPs per channel per token."""
    return float(2 * channels * width)


def causal_mean(L: int, cap: int | None = None) -> float:
    """Mean over positions t = 1..L of min(t, cap): keys a causal query sees, exact triangle."""
    if cap is None or cap >= L:
        return (L + 1) / 2
    return (cap * (cap + 1) / 2 + (L - cap) * cap) / L


def identity_map(*names: str) -> dict[str, str]:
    """An `hf_map` for weights stored under the same names as ours (HF Llama-style, fla)."""
    return {k: k for k in names}


def from_attention(
    q: str = "heads", k: str = "heads", v: str = "heads", o: str = "heads", out: str = "o_proj.weight"
) -> dict[str, FromAttention]:
    """A `from_attention` map: q/k/v projections from the teacher's, each with the head count its
    option names (q, k, v), and the output projection `out` from the teacher's o_proj (o)."""
    return {
        "q_proj.weight": FromAttention("q_proj.weight", q),
        "k_proj.weight": FromAttention("k_proj.weight", k),
        "v_proj.weight": FromAttention("v_proj.weight", v),
        out: FromAttention("o_proj.weight", o, axis=1),
    }


# SMs of the card the decode kernel counts assume (an H100's): the decode step's attention kernels
# split a row's keys over programs, and add a merge launch, while batch × kv heads leave SMs idle.
DECODE_SMS = 132
