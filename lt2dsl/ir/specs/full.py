"""`full`: softmax attention with RoPE, GQA and the optional SDPA output gate (mixers.md §12)."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import CacheTensor, Flops, FromAttention, LayerSpec, Mode, Option, Opts
from lt2dsl.ir.specs.channel import norm_saved
from lt2dsl.ir.specs.common import (
    ATTENTION,
    ATTENTION_HF,
    COMMON,
    causal_mean,
    from_attention,
    identity_map,
    lin,
    proj_flops,
)


def attention_weights(o: Opts, D: int) -> dict[str, tuple[int, ...]]:
    """q, k, v, o projections (+ biases), the output gate and qk-norm weights.

    q_proj (H·d, D), k_proj / v_proj (HKV·d, D), o_proj (D, H·d); `gate=sdpa`: g_proj (H·d, D),
    `gate=headwise`: g_proj (H, D); `qk_norm`: q_norm, k_norm (d). `bias=true` adds biases to
    q, k, v, o (and the gate), as LLaMA's `attention_bias` does; `qkv_bias=true` to q, k, v only
    (Qwen2): H·d + 2·HKV·d parameters.
    """
    H, HKV, d = o["heads"], o["kv_heads"], o["head_dim"]
    w = {
        "q_proj.weight": lin(H * d, D),
        "k_proj.weight": lin(HKV * d, D),
        "v_proj.weight": lin(HKV * d, D),
        "o_proj.weight": lin(D, H * d),
    }
    if o["bias"] or o.get("qkv_bias"):
        w |= {"q_proj.bias": (H * d,), "k_proj.bias": (HKV * d,), "v_proj.bias": (HKV * d,)}
    if o["bias"]:
        w["o_proj.bias"] = (D,)
    g_out = {"sdpa": H * d, "headwise": H}.get(o["gate"])
    if g_out:
        w["g_proj.weight"] = lin(g_out, D)
        if o["bias"]:
            w["g_proj.bias"] = (g_out,)
    if o["qk_norm"]:
        w |= {"q_norm.weight": (d,), "k_norm.weight": (d,)}
    return w


# HF Llama / Qwen / Gemma / Ouro (`self_attn.`) and fla (`attn.`) name them as we do.
HF_MAP: dict[str, str | None] = identity_map(
    *(f"{p}_proj.{t}" for p in "qkvo" for t in ("weight", "bias")), "q_norm.weight", "k_norm.weight"
) | {"rotary_emb.inv_freq": None}


def attention_saved(o: Opts, cfg: ModelConfig) -> int:
    """Elements per token the attention op keeps for backward (`kernels/attention/ops.py`): the
    rotated q `[T, H, d]`, k and v `[T, HKV, d]`, the output `[T, H, d]` (o_proj's input too) and
    the fp32 log-sum-exp `[T, H]`; the output gate it applies (`[T, H, d]` sdpa, `[T, H]`
    headwise); with `qk_norm` the per-head q and k norms (`norm_saved`)."""
    H, HKV, d = o["heads"], o["kv_heads"], o["head_dim"]
    gate = {"sdpa": H * d, "headwise": H}.get(o["gate"], 0)
    qk = 0
    if o["qk_norm"]:
        qk = norm_saved(H * d, H, cfg.norm.offset) + norm_saved(HKV * d, HKV, cfg.norm.offset)
    return 2 * H * d + 2 * HKV * d + 2 * H + gate + qk


PROJ = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "g_proj.weight"]

# An attention student of an attention teacher (`full`, `swa`, `dsa`, `nsa`) starts as that teacher:
# every weight both have, k/v heads repeated where the student has more kv heads.
FROM_ATTENTION = from_attention(k="kv_heads", v="kv_heads") | {
    "q_proj.bias": FromAttention("q_proj.bias", "heads"),
    "k_proj.bias": FromAttention("k_proj.bias", "kv_heads"),
    "v_proj.bias": FromAttention("v_proj.bias", "kv_heads"),
    "o_proj.bias": FromAttention("o_proj.bias", None),
    "g_proj.weight": FromAttention("g_proj.weight", "heads"),
    "g_proj.bias": FromAttention("g_proj.bias", "heads"),
    "q_norm.weight": FromAttention("q_norm.weight", None),
    "k_norm.weight": FromAttention("k_norm.weight", None),
}


def attention_core(H: int, d: int, keys: float) -> float:
    """QKᵀ and PV: 2·d each per visible key, per query head (mixers.md §9(d), §12(d))."""
    return 4.0 * d * keys * H


@dataclass(frozen=True)
class FullSpec(LayerSpec):
    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        return attention_weights(o, cfg.dim)

    def kv_len(self, o: Opts, L: int) -> int:
        return L

    def cache(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """KV cache: k and v, (B, HKV, L, d) each, in the kv dtype (mixers.md §12(c))."""
        shape = (batch, o["kv_heads"], self.kv_len(o, L), o["head_dim"])
        return {"k": CacheTensor(shape, "kv", "kv"), "v": CacheTensor(shape, "kv", "kv")}

    def visible(self, o: Opts, L: int, mode: Mode, causal: str) -> float:
        """Mean number of keys a query sees: (L+1)/2 causal-exact, L with `--causal full`."""
        if mode == "decode" or causal == "full":
            return float(L)
        return causal_mean(L)

    def flops(self, o: Opts, cfg: ModelConfig, L: int, mode: Mode, causal: str = "exact") -> Flops:
        proj = proj_flops(self.weights(o, cfg), PROJ)
        core = attention_core(o["heads"], o["head_dim"], self.visible(o, L, mode, causal))
        return Flops(proj=proj, core=core)

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        return attention_saved(o, cfg)

    def kept_outputs(self, o: Opts, cfg: ModelConfig) -> int:
        """One attention op: o `[T, H, d]` and its fp32 log-sum-exp `[T, H]`."""
        return o["heads"] * o["head_dim"] + 2 * o["heads"]

    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """q/k/v (and gate) GEMM, RoPE of q and k written into the cache, split-KV attention and
        its combine, o_proj."""
        return 5 + attention_extra_kernels(o)

    def decode_once(self, o: Opts, cfg: ModelConfig) -> dict[tuple, int]:
        """The RoPE table's cos and sin rows at the step's positions; the attention lengths."""
        return {rope_key(o): 2, ("attention lengths",): 2}


def attention_extra_kernels(o: Opts) -> int:
    """Decode launches the attention options add: `qk_norm`'s two norms (biases ride in the
    GEMMs)."""
    return 2 * bool(o["qk_norm"])


def rope_key(o: Opts, dims: int | None = None) -> tuple:
    """What a RoPE table's gathered rows depend on (`engine.positions.Positions.rope_rows`)."""
    scaling = o.get("rope_scaling", "none")
    return ("rope", dims or o.get("rope_dim") or o["head_dim"], float(o["rope_theta"]), scaling,
            o.get("rope_factor", 1.0) if scaling != "none" else None)  # fmt: skip


SPEC = FullSpec(
    kind="full",
    summary="softmax attention with RoPE, GQA and an optional SDPA output gate",
    options=(*COMMON, *ATTENTION, *ATTENTION_HF),
    module="lt2dsl.lowering.layers.attention:Attention",
    hf_map=HF_MAP,
    from_attention=FROM_ATTENTION,
    source="mixers.md §12 (Qiu et al. 2025, arXiv 2505.06708); HF LLaMA for the GQA layout",
)

SWA_OPTIONS = (
    Option(
        "window",
        "size",
        "keys each query sees, itself included (mixers.md §9)",
        default=512,
        min=1,
        positional=True,
    ),
)
