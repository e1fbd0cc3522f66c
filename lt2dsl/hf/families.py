"""Readers of the transformer families: Llama (and SmolLM2), Qwen2 / 2.5, Qwen3, Gemma 3 (text), Ouro.

Each reads a config dict (`config.json`) into a `Plan`; a setting `.lt2` cannot express is refused
with the config field that has it (`Refused`), never approximated.
"""

from __future__ import annotations

from lt2dsl.hf.common import dtype_setting, get, layer_types, refuse_moe, rope_opts
from lt2dsl.hf.plan import Layer, Plan, call, num
from lt2dsl.hf.refuse import refuse_unless

LAYER = "model.layers.{}."
MLP_MAP = {f"{LAYER}mlp.{p}_proj.weight": f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
# Pre-norm blocks (Llama, Qwen): the norm before attention and the one before the MLP.
PRE_NORM_MAP = {
    f"{LAYER}input_layernorm.weight": "norms.0.weight",
    f"{LAYER}post_attention_layernorm.weight": "norms.1.weight",
} | MLP_MAP
# Sandwich blocks: norms.0 before / norms.1 after the mixer, norms.2 before / norms.3 after the MLP.
GEMMA3_NORM_MAP = {
    f"{LAYER}input_layernorm.weight": "norms.0.weight",
    f"{LAYER}post_attention_layernorm.weight": "norms.1.weight",
    f"{LAYER}pre_feedforward_layernorm.weight": "norms.2.weight",
    f"{LAYER}post_feedforward_layernorm.weight": "norms.3.weight",
} | MLP_MAP
OURO_NORM_MAP = {
    f"{LAYER}input_layernorm.weight": "norms.0.weight",
    f"{LAYER}input_layernorm_2.weight": "norms.1.weight",
    f"{LAYER}post_attention_layernorm.weight": "norms.2.weight",
    f"{LAYER}post_attention_layernorm_2.weight": "norms.3.weight",
} | MLP_MAP
MODEL_MAP = {
    "model.embed_tokens.weight": "embed.weight",
    "model.norm.weight": "final_norm.weight",
    "lm_head.weight": "lm_head.weight",
}
MIXER = f"{LAYER}self_attn."


def dims(cfg: dict) -> tuple[int, int, int, int]:
    """(D, heads, kv heads, head dim)."""
    D, H = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    KV = int(get(cfg, "num_key_value_heads", H))
    return D, H, KV, int(get(cfg, "head_dim", D // H))


def base_settings(cfg: dict, *, norm: str, mlp: str) -> dict[str, str]:
    D, H, KV, d = dims(cfg)
    refuse_unless(not cfg.get("mlp_bias"), "mlp_bias", "MLP biases cannot be expressed in `.lt2`")
    tied = bool(cfg.get("tie_word_embeddings", True))
    return {
        "dim": str(D),
        "vocab": str(int(cfg["vocab_size"])),
        "heads": str(H),
        "head_dim": str(d),
        "kv_heads": str(KV),
        "mlp": f"{mlp}(hidden={int(cfg['intermediate_size'])})",
        "norm": norm,
        "max_len": str(int(get(cfg, "max_position_embeddings", 8192))),
        "tie_embeddings": "true" if tied else "false",
        "dtype": dtype_setting(cfg),
    }


def head_map(cfg: dict) -> dict[str, str | None]:
    tied = bool(cfg.get("tie_word_embeddings", True))
    # A tied checkpoint may still store a copy of the head; the embedding is the one we keep.
    return MODEL_MAP | ({"lm_head.weight": None} if tied else {})


def attention_layers(
    cfg: dict, block_map: dict[str, str], extra: dict[str, str], sandwich: bool = False
) -> list[Layer]:
    """One `full` / `swa` layer per `layer_types` entry, roles `attn` / `local`."""
    n_layers = int(cfg["num_hidden_layers"])
    d = dims(cfg)[3]
    out = []
    for t in layer_types(cfg, n_layers):
        opts = dict(extra)
        kind, role = "full", "attn"
        if t == "sliding_attention":
            kind, role = "swa", "local"
            opts = {"window": str(int(cfg["sliding_window"]))} | opts
        opts |= rope_opts(cfg, t, d)
        if sandwich:
            opts["norm"] = "sandwich"
        out.append(Layer(role, call(kind, opts), kind, block_map, MIXER))
    return out


def act(cfg: dict, expected: str, field: str = "hidden_act") -> None:
    v = cfg.get(field, expected)
    refuse_unless(v == expected, field, f"activation `{v}` (this family's MLP is `{expected}`)")


def dense(family: str, extra: dict[str, str]):
    """The reader of a pre-norm SwiGLU family whose attention takes `extra` options."""

    def read(cfg: dict, name: str) -> Plan:
        refuse_moe(cfg)
        act(cfg, "silu")
        opts = dict(extra)
        if cfg.get("attention_bias"):
            opts["bias"] = "true"
        eps = num(float(get(cfg, "rms_norm_eps", 1e-6)))
        settings = base_settings(cfg, norm=f"rmsnorm(eps={eps})", mlp="swiglu")
        return Plan(family, name, settings, attention_layers(cfg, PRE_NORM_MAP, opts), head_map(cfg))

    return read


# Llama 2 / 3.x and SmolLM2: `attention_bias` biases q, k, v and o.
llama = dense("llama", {})
# Qwen2 / 2.5: biases on q, k, v only.
qwen2 = dense("qwen2", {"qkv_bias": "true"})
# Qwen3 (dense): per-head q/k RMSNorm before RoPE.
qwen3 = dense("qwen3", {"qk_norm": "true"})


def gemma3(cfg: dict, name: str) -> Plan:
    """Gemma 3 text: (1 + w) RMSNorms, embeddings × sqrt(D), sandwich norms, q/k norms, tanh-GeGLU,
    sliding layers with their own RoPE base. Soft-capping and a query scale other than
    head_dim^-1/2 are refused."""
    refuse_moe(cfg)
    act(cfg, "gelu_pytorch_tanh", "hidden_activation")
    d = dims(cfg)[3]
    for f in ("attn_logit_softcapping", "final_logit_softcapping"):
        refuse_unless(cfg.get(f) is None, f, "logit soft-capping cannot be expressed in `.lt2`")
    refuse_unless(
        not cfg.get("use_bidirectional_attention"), "use_bidirectional_attention", "bidirectional attention"
    )
    scalar = get(cfg, "query_pre_attn_scalar", d)
    refuse_unless(
        float(scalar) == float(d),
        "query_pre_attn_scalar",
        f"a query scale of {scalar}^-1/2 (`.lt2` attention scales by head_dim^-1/2 = {d}^-1/2)",
    )
    eps = num(float(get(cfg, "rms_norm_eps", 1e-6)))
    extra = {"qk_norm": "true"} | ({"bias": "true"} if cfg.get("attention_bias") else {})
    layers = [
        Layer("global" if x.role == "attn" else x.role, x.call, x.kind, x.block_map, x.mixer)
        for x in attention_layers(cfg, GEMMA3_NORM_MAP, extra, sandwich=True)
    ]
    settings = base_settings(cfg, norm=f"rmsnorm(eps={eps}, offset=true)", mlp="geglu")
    settings["embed_scale"] = "true"
    return Plan("gemma3_text", name, settings, layers, head_map(cfg))


def ouro(cfg: dict, name: str) -> Plan:
    """Ouro (ByteDance): `num_hidden_layers` sandwich blocks looped `total_ut_steps` times with shared
    weights, the final norm after every iteration, the exit gate `model.early_exit_gate` selecting
    each token's iteration at `early_exit_threshold` (none: the last iteration, gate dropped)."""
    refuse_moe(cfg)
    act(cfg, "silu")
    refuse_unless(cfg.get("early_exit_step") is None, "early_exit_step", "a fixed exit step")
    eps = num(float(get(cfg, "rms_norm_eps", 1e-6)))
    layers = attention_layers(cfg, OURO_NORM_MAP, {})
    T = int(get(cfg, "total_ut_steps", 4))
    thr = cfg.get("early_exit_threshold")
    loop = f"loop T={T}, final_norm=true, norm=sandwich"
    model_map = head_map(cfg)
    gate = {
        "model.early_exit_gate.weight": "loops.0.exit.weight",
        "model.early_exit_gate.bias": "loops.0.exit.bias",
    }
    if thr is None:
        model_map |= dict.fromkeys(gate)
    else:
        refuse_unless(0 < float(thr) <= 1, "early_exit_threshold", f"exit threshold {thr} outside (0, 1]")
        loop += f", exit=gate(threshold={num(float(thr))})"
        model_map |= gate
    settings = base_settings(cfg, norm=f"rmsnorm(eps={eps})", mlp="swiglu")
    notes = (
        []
        if thr is not None
        else ["No early_exit_threshold: the last iteration is the output; the exit gate is unused."]
    )
    return Plan("ouro", name, settings, layers, model_map, loop=loop, notes=notes)


READERS = {
    "llama": llama,
    "qwen2": qwen2,
    "qwen3": qwen3,
    "gemma3_text": gemma3,
    "ouro": ouro,
}
