"""Readers of the peer's (fla) model families: GatedDeltaNet, KDA, GLA, DeltaNet, each with fla's
hybrid softmax-attention layers (`config.attn`).

fla's blocks are pre-norm (`attn_norm`, `mlp_norm`), its MLP a SwiGLU of width `intermediate_size`
or 2/3 · hidden_ratio · D rounded up to 256, its mixers named as ours (`LayerSpec.hf_map`). The
config's `norm_eps` is both the block norms' and the mixers' output-norm epsilon (fla passes it to
each layer). Read from fla's `fla/models/<family>/configuration_*.py` and `fla/layers/*.py`.
"""

from __future__ import annotations

import math

from lt2dsl.hf.common import dtype_setting, get, refuse_moe
from lt2dsl.hf.plan import Layer, Plan, call, num
from lt2dsl.hf.refuse import refuse_unless

LAYER = "model.layers.{}."
BLOCK_MAP = {
    f"{LAYER}attn_norm.weight": "norms.0.weight",
    f"{LAYER}mlp_norm.weight": "norms.1.weight",
} | {f"{LAYER}mlp.{p}_proj.weight": f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
MODEL_MAP = {
    "model.embeddings.weight": "embed.weight",
    "model.norm.weight": "final_norm.weight",
    "lm_head.weight": "lm_head.weight",
}
MIXER = f"{LAYER}attn."


def mlp_hidden(cfg: dict) -> int:
    """fla's GatedMLP width: `intermediate_size`, else 2/3 · hidden_ratio · D rounded up to 256."""
    if cfg.get("intermediate_size") is not None:
        return int(cfg["intermediate_size"])
    width = int(int(cfg["hidden_size"]) * get(cfg, "hidden_ratio", 4) * 2 / 3)
    return 256 * math.ceil(width / 256)


def settings(cfg: dict, heads: int, head_dim: int) -> dict[str, str]:
    refuse_unless(
        get(cfg, "hidden_act", "swish") == "swish", "hidden_act", "fla's MLP activation must be swish"
    )
    refuse_unless(cfg.get("attnres_block_size") is None, "attnres_block_size", "attention residuals")
    tied = bool(cfg.get("tie_word_embeddings", False))
    return {
        "dim": str(int(cfg["hidden_size"])),
        "vocab": str(int(cfg["vocab_size"])),
        "heads": str(heads),
        "head_dim": str(head_dim),
        "mlp": f"swiglu(hidden={mlp_hidden(cfg)})",
        "norm": f"rmsnorm(eps={num(float(get(cfg, 'norm_eps', 1e-6)))})",
        "max_len": str(int(get(cfg, "max_position_embeddings", 2048))),
        "tie_embeddings": "true" if tied else "false",
        "dtype": dtype_setting(cfg),
    }


def attn_layers(cfg: dict) -> dict[int, Layer]:
    """fla's hybrid layers: `attn = {layers, num_heads, num_kv_heads, qkv_bias, window_size,
    rope_theta}` (or a list of such), full attention with RoPE over head_dim = D / num_heads."""
    specs = cfg.get("attn") or []
    out: dict[int, Layer] = {}
    D = int(cfg["hidden_size"])
    for spec in [specs] if isinstance(specs, dict) else specs:
        H = int(spec["num_heads"])
        KV = int(spec.get("num_kv_heads") or H)
        opts = {"heads": str(H), "head_dim": str(D // H), "kv_heads": str(KV)}
        opts["rope_theta"] = num(float(spec.get("rope_theta") or 10000.0))
        if spec.get("qkv_bias"):
            opts["qkv_bias"] = "true"
        kind = "full"
        if spec.get("window_size"):
            kind, opts = "swa", {"window": str(int(spec["window_size"]))} | opts
        role = "attn" if len(out) == 0 or kind == "full" else "local"
        for i in spec["layers"]:
            out[int(i)] = Layer(role, call(kind, opts), kind, BLOCK_MAP, MIXER)
    return out


def hybrid(cfg: dict, name: str, family: str, kind: str, opts: dict[str, str], H: int, d: int) -> Plan:
    """The plan of an fla model whose non-attention layers are `kind(opts)`."""
    refuse_moe(cfg)
    attn = attn_layers(cfg)
    mixer = Layer(f"{kind}_layer", call(kind, opts), kind, BLOCK_MAP, MIXER)
    layers = [attn.get(i, mixer) for i in range(int(cfg["num_hidden_layers"]))]
    model_map = MODEL_MAP | ({"lm_head.weight": None} if cfg.get("tie_word_embeddings") else {})
    return Plan(family, name, settings(cfg, H, d), layers, model_map)


def conv_opts(cfg: dict) -> dict[str, str]:
    return {"conv": str(int(get(cfg, "conv_size", 4)))} if get(cfg, "use_short_conv", True) else {"conv": "0"}


def norm_eps(cfg: dict) -> str:
    return num(float(get(cfg, "norm_eps", 1e-6)))


def gated_deltanet(cfg: dict, name: str) -> Plan:
    act = get(cfg, "output_gate_activation", "swish")
    refuse_unless(act in ("swish", "silu"), "output_gate_activation", f"output gate activation `{act}`")
    H, K = int(cfg["num_heads"]), int(get(cfg, "head_dim", 256))
    opts = {"expand_v": num(float(get(cfg, "expand_v", 2.0)))}
    if cfg.get("num_v_heads") is not None:
        opts["v_heads"] = str(int(cfg["num_v_heads"]))
    opts |= conv_opts(cfg)
    opts |= {"gate": "true" if get(cfg, "use_gate", True) else "false", "norm_eps": norm_eps(cfg)}
    if cfg.get("allow_neg_eigval"):
        opts["neg_eigval"] = "true"
    return hybrid(cfg, name, "gated_deltanet", "gdn", opts, H, K)


def kda(cfg: dict, name: str) -> Plan:
    refuse_unless(not cfg.get("allow_neg_eigval"), "allow_neg_eigval", "KDA with negative eigenvalues")
    H, K = int(cfg["num_heads"]), int(get(cfg, "head_dim", 128))
    opts = {"expand_v": num(float(get(cfg, "expand_v", 1.0)))}
    if cfg.get("num_v_heads") is not None:
        opts["v_heads"] = str(int(cfg["num_v_heads"]))
    opts |= conv_opts(cfg)
    if cfg.get("safe_gate"):
        refuse_unless(cfg.get("lower_bound") is not None, "lower_bound", "a safe gate without a lower bound")
        opts |= {"safe_gate": "true", "lower_bound": num(float(cfg["lower_bound"]))}
    opts["norm_eps"] = norm_eps(cfg)
    return hybrid(cfg, name, "kda", "kda", opts, H, K)


def gla(cfg: dict, name: str) -> Plan:
    """fla GLA with its model defaults (no short conv, no feature map, SiLU output gate, low-rank
    decay gate of rank 16 and normalizer 16): head dims K = D·expand_k / H, V = D·expand_v / H,
    k / v / decay for `num_kv_heads` heads shared by groups of query heads."""
    for f, ok in (
        ("feature_map", cfg.get("feature_map") is None),
        ("use_short_conv", not cfg.get("use_short_conv")),
        ("use_output_gate", get(cfg, "use_output_gate", True)),
        ("use_gv", not cfg.get("use_gv")),
        ("clamp_min", cfg.get("clamp_min") is None),
        ("elementwise_affine", get(cfg, "elementwise_affine", True)),
    ):
        refuse_unless(bool(ok), f, f"GLA with `{f}` = {cfg.get(f)}")
    D, H = int(cfg["hidden_size"]), int(cfg["num_heads"])
    ek, ev = float(get(cfg, "expand_k", 0.5)), float(get(cfg, "expand_v", 1.0))
    V = round(D * ev) // H
    opts = {
        "expand_k": num(ek / ev),
        "kv_heads": str(int(get(cfg, "num_kv_heads", H))),
        "norm_eps": norm_eps(cfg),
    }
    return hybrid(cfg, name, "gla", "gla", opts, H, V)


def delta_net(cfg: dict, name: str) -> Plan:
    for f, expected in (
        ("qk_norm", "l2"),
        ("qk_activation", "silu"),
        ("use_beta", True),
        ("use_output_norm", True),
        ("expand_k", 1.0),
        ("expand_v", 1.0),
        ("allow_neg_eigval", False),
    ):
        v = cfg.get(f, expected)
        refuse_unless(v == expected, f, f"DeltaNet with `{f}` = {v} (lt2dsl's `deltanet` has {expected})")
    D, H = int(cfg["hidden_size"]), int(cfg["num_heads"])
    opts = conv_opts(cfg) | {"gate": "true" if cfg.get("use_gate") else "false", "norm_eps": norm_eps(cfg)}
    return hybrid(cfg, name, "delta_net", "deltanet", opts, H, D // H)


READERS = {
    "gated_deltanet": gated_deltanet,
    "kda": kda,
    "gla": gla,
    "delta_net": delta_net,
}
