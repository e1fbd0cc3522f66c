"""Checkpoint layouts for the import checks (`tests/hf/`, `bench/hf_parity.py`): random weights
under Ouro's and fla's own names and shapes (read from their public modeling code and
`fla/layers/*.py`), written as a checkpoint folder (config.json + model.safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lt2dsl.hf.checkpoint import save_safetensors

VOCAB = 64


def write_checkpoint(root: Path, config: dict, state: dict[str, torch.Tensor]) -> Path:
    """A checkpoint folder laid out as HF writes one: config.json + model.safetensors."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    save_safetensors(state, root / "model.safetensors", metadata={"format": "pt"})
    return root


def random_state(
    shapes: dict[str, tuple[int, ...]], seed: int = 0, std: float = 0.3
) -> dict[str, torch.Tensor]:
    """Random fp32 tensors; norm weights around 1 (so a swapped norm changes the output)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, s in shapes.items():
        t = torch.randn(s, generator=g) * std
        out[k] = t + 1 if "norm" in k else t
    return out


def ouro_config(**kw) -> dict:
    """Ouro's config.json fields (ByteDance/Ouro-1.4B), shrunk."""
    return {
        "model_type": "ouro",
        "architectures": ["OuroForCausalLM"],
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": VOCAB,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "total_ut_steps": 3,
        "early_exit_threshold": 1.0,
        "dtype": "float32",
    } | kw


def ouro_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,), "lm_head.weight": (V, D)}
    shapes |= {"model.early_exit_gate.weight": (1, D), "model.early_exit_gate.bias": (1,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {f"{p}self_attn.{n}_proj.weight": (D, D) for n in "qkvo"}
        shapes |= {
            f"{p}mlp.gate_proj.weight": (F, D),
            f"{p}mlp.up_proj.weight": (F, D),
            f"{p}mlp.down_proj.weight": (D, F),
        }
        for n in (
            "input_layernorm",
            "input_layernorm_2",
            "post_attention_layernorm",
            "post_attention_layernorm_2",
        ):
            shapes[f"{p}{n}.weight"] = (D,)
    return shapes


OURO_1P4B = ouro_config(  # ByteDance/Ouro-1.4B's config.json values
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    vocab_size=49152,
    max_position_embeddings=65536,
    total_ut_steps=4,
    dtype="bfloat16",
)


D, H, L, MLP = 32, 2, 3, 64


def base_config(model_type: str, **kw) -> dict:
    return {
        "model_type": model_type,
        "hidden_size": D,
        "num_heads": H,
        "num_hidden_layers": L,
        "intermediate_size": MLP,
        "vocab_size": VOCAB,
        "norm_eps": 1e-6,
        "hidden_act": "swish",
        "tie_word_embeddings": False,
        "max_position_embeddings": 64,
        "fuse_norm": True,
        "dtype": "float32",
    } | kw


def block_shapes(p: str, D: int = D, MLP: int = MLP) -> dict[str, tuple[int, ...]]:
    return {
        f"{p}attn_norm.weight": (D,),
        f"{p}mlp_norm.weight": (D,),
        f"{p}mlp.gate_proj.weight": (MLP, D),
        f"{p}mlp.up_proj.weight": (MLP, D),
        f"{p}mlp.down_proj.weight": (D, MLP),
    }


def gdn_shapes(p: str, D: int = D, H: int = H, K: int = 8, V: int = 16, W: int = 4) -> dict:
    """fla's `GatedDeltaNet` layer (here head_dim 8, expand_v 2: K = 8, V = 16)."""
    return {
        f"{p}q_proj.weight": (H * K, D),
        f"{p}k_proj.weight": (H * K, D),
        f"{p}v_proj.weight": (H * V, D),
        f"{p}a_proj.weight": (H, D),
        f"{p}b_proj.weight": (H, D),
        f"{p}A_log": (H,),
        f"{p}dt_bias": (H,),
        f"{p}q_conv1d.weight": (H * K, 1, W),
        f"{p}k_conv1d.weight": (H * K, 1, W),
        f"{p}v_conv1d.weight": (H * V, 1, W),
        f"{p}g_proj.weight": (H * V, D),
        f"{p}o_norm.weight": (V,),
        f"{p}o_proj.weight": (D, H * V),
    }


def mixer_shapes(kind: str, p: str, W: int = 4) -> dict[str, tuple[int, ...]]:
    """The weights fla's layer of `kind` stores (names and shapes from `fla/layers/*.py`)."""
    if kind == "gdn":
        return gdn_shapes(p)
    if kind == "deltanet":  # K = V = D / H
        K = D // H
        convs = {f"{p}{n}_conv1d.weight": (D, 1, W) for n in "qkv"}
        return (
            {f"{p}{n}_proj.weight": (D, D) for n in "qkvo"}
            | convs
            | {
                f"{p}b_proj.weight": (H, D),
                f"{p}o_norm.weight": (K,),
            }
        )
    if kind == "kda":  # head_dim 8, expand_v 2: K = 8, V = 16
        K, V = 8, 16
        return {
            f"{p}q_proj.weight": (H * K, D),
            f"{p}k_proj.weight": (H * K, D),
            f"{p}v_proj.weight": (H * V, D),
            f"{p}q_conv1d.weight": (H * K, 1, W),
            f"{p}k_conv1d.weight": (H * K, 1, W),
            f"{p}v_conv1d.weight": (H * V, 1, W),
            f"{p}f_proj.0.weight": (V, D),
            f"{p}f_proj.1.weight": (H * K, V),
            f"{p}b_proj.weight": (H, D),
            f"{p}A_log": (H,),
            f"{p}dt_bias": (H * K,),
            f"{p}g_proj.0.weight": (V, D),
            f"{p}g_proj.1.weight": (H * V, V),
            f"{p}g_proj.1.bias": (H * V,),
            f"{p}o_norm.weight": (V,),
            f"{p}o_proj.weight": (D, H * V),
        }
    assert kind == "gla"  # expand_k 0.5, expand_v 1: K = 8, V = 16, rank-16 decay gate, 1 kv head
    K, V, KV = D // 2 // H, D // H, 1
    return {
        f"{p}q_proj.weight": (H * K, D),
        f"{p}k_proj.weight": (KV * K, D),
        f"{p}v_proj.weight": (KV * V, D),
        f"{p}g_proj.weight": (H * V, D),
        f"{p}gk_proj.0.weight": (16, D),
        f"{p}gk_proj.1.weight": (KV * K, 16),
        f"{p}gk_proj.1.bias": (KV * K,),
        f"{p}o_proj.weight": (D, H * V),
        f"{p}g_norm_swish_gate.weight": (V,),
    }


def attn_shapes(p: str, heads: int, kv: int, D: int = D) -> dict[str, tuple[int, ...]]:
    d = D // heads
    return {
        f"{p}q_proj.weight": (D, D),
        f"{p}k_proj.weight": (kv * d, D),
        f"{p}v_proj.weight": (kv * d, D),
        f"{p}o_proj.weight": (D, D),
    }


FLA_CASES = {
    # GatedDeltaNet with fla's hybrid attention on layer 1 (GQA, sliding window of 4 keys)
    "gdn": (
        "gated_deltanet",
        dict(
            head_dim=8,
            expand_v=2.0,
            use_gate=True,
            attn={"layers": [1], "num_heads": 4, "num_kv_heads": 2, "window_size": 4, "rope_theta": 10000.0},
        ),
    ),
    "deltanet": ("delta_net", dict(attn={"layers": [2], "num_heads": 2, "rope_theta": 500000.0})),
    "kda": ("kda", dict(head_dim=8, expand_v=2.0)),
    "gla": ("gla", dict(expand_k=0.5, expand_v=1.0, num_kv_heads=1, tie_word_embeddings=True)),
}


def fla_layout(kind: str) -> tuple[dict, dict]:
    """(config, weight shapes) of the tiny checkpoint of `kind`."""
    model_type, extra = FLA_CASES[kind]
    cfg = base_config(model_type, **extra)
    attn = cfg.get("attn") or {"layers": []}
    shapes = {"model.embeddings.weight": (VOCAB, D), "model.norm.weight": (D,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (VOCAB, D)
    for i in range(L):
        p = f"model.layers.{i}."
        shapes |= block_shapes(p)
        if i in attn["layers"]:
            shapes |= attn_shapes(
                p + "attn.", attn["num_heads"], attn.get("num_kv_heads") or attn["num_heads"]
            )
        else:
            shapes |= mixer_shapes(kind, p + "attn.")
    return cfg, shapes


def fla_checkpoint(kind: str, tmp_path) -> tuple[dict, dict]:
    cfg, shapes = fla_layout(kind)
    state = random_state(shapes)
    for k in state:  # fla's decay parameters: A = e^{A_log} in [1, 16], dt_bias = softplus⁻¹(dt)
        if k.endswith("A_log"):
            state[k] = torch.linspace(0.0, 2.7, state[k].numel())
        elif k.endswith("dt_bias"):
            state[k] = torch.linspace(-6.0, -2.0, state[k].numel())
    write_checkpoint(tmp_path, cfg, state)
    return cfg, state


def full_gdn_layout() -> tuple[dict, dict]:
    """(config, weight shapes) of an fla GatedDeltaNet hybrid at 1.3B scale (D 2048, 21 layers of
    16 heads × 128, expand_v 2, attention on layers 5, 11, 17), for `bench/hf_parity.py`."""
    D, H, L, MLP, K = 2048, 16, 21, 5632, 128
    attn = {"layers": [5, 11, 17], "num_heads": 16, "rope_theta": 10000.0}
    cfg = base_config("gated_deltanet", head_dim=K, expand_v=2.0, use_gate=True, attn=attn)
    cfg |= {"hidden_size": D, "num_heads": H, "num_hidden_layers": L, "intermediate_size": MLP}
    shapes = {"model.embeddings.weight": (VOCAB, D), "model.norm.weight": (D,), "lm_head.weight": (VOCAB, D)}
    for i in range(L):
        p = f"model.layers.{i}."
        shapes |= block_shapes(p, D, MLP)
        mixer = (
            attn_shapes(p + "attn.", 16, 16, D)
            if i in attn["layers"]
            else gdn_shapes(p + "attn.", D, H, K, 2 * K)
        )
        shapes |= mixer
    return cfg, shapes
