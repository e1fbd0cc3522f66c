"""Config-reading helpers shared by the family readers: dtypes, MoE refusal, RoPE, MLP widths."""

from __future__ import annotations

from typing import Any

from lt2dsl.hf.plan import num
from lt2dsl.hf.refuse import Refused, refuse_unless

DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# Any of these set (and non-zero) means routed experts, which `.lt2` has no layer for.
MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
SUPPORTED_ROPE = ("default", "linear", "llama3")


def get(cfg: dict, name: str, default: Any = None) -> Any:
    v = cfg.get(name, default)
    return default if v is None else v


def refuse_moe(cfg: dict) -> None:
    for f in MOE_FIELDS:
        v = cfg.get(f)
        refuse_unless(
            not v,
            f,
            f"mixture-of-experts layers (`{f}` = {v}) cannot be expressed in `.lt2`",
            help="`.lt2` channel mixers are dense (`swiglu`, `geglu`, `gelu`); import a dense checkpoint",
        )


def dtype_setting(cfg: dict) -> str:
    """The checkpoint's stored dtype as a `.lt2` `dtype` value (bf16 when the config names none)."""
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    return DTYPES.get(str(name).removeprefix("torch."), "bf16")


def rope_parameters(cfg: dict, layer_type: str | None) -> tuple[dict, str]:
    """(RoPE parameters of a layer type, the config field they came from), for both config forms:
    transformers 5's `rope_parameters` (per layer type for Gemma 3) and 4's `rope_theta` +
    `rope_scaling` (+ Gemma 3's `rope_local_base_freq` for sliding layers, which never scale)."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params:
        if layer_type in params and isinstance(params[layer_type], dict):
            return params[layer_type], "rope_parameters"
        if all(isinstance(v, dict) for v in params.values()):
            raise Refused("rope_parameters", f"no RoPE parameters for layer type `{layer_type}`")
        return params, "rope_parameters"
    theta = get(cfg, "rope_theta", 10000.0)
    if layer_type == "sliding_attention" and "rope_local_base_freq" in cfg:
        return {"rope_type": "default", "rope_theta": cfg["rope_local_base_freq"]}, "rope_local_base_freq"
    scaling = dict(cfg.get("rope_scaling") or {})
    return {**scaling, "rope_theta": theta}, "rope_scaling"


def rope_opts(cfg: dict, layer_type: str | None, head_dim: int) -> dict[str, str]:
    """The `full` / `swa` RoPE options of a layer type (defaults left out)."""
    p, where = rope_parameters(cfg, layer_type)
    kind = p.get("rope_type", p.get("type", "default"))
    refuse_unless(
        kind in SUPPORTED_ROPE,
        where,
        f"RoPE type `{kind}` is not supported",
        help=f"`.lt2` has RoPE scaling {', '.join(f'`{k}`' for k in SUPPORTED_ROPE)}",
    )
    out = {"rope_theta": num(float(p.get("rope_theta", 10000.0)))}
    factor = p.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if factor is not None and float(factor) != 1.0:
        out["rope_dim"] = str(int(head_dim * float(factor)))
    if kind == "linear":
        out |= {"rope_scaling": "linear", "rope_factor": num(float(p["factor"]))}
    elif kind == "llama3":
        out |= {
            "rope_scaling": "llama3",
            "rope_factor": num(float(p["factor"])),
            "rope_low_freq": num(float(p.get("low_freq_factor", 1.0))),
            "rope_high_freq": num(float(p.get("high_freq_factor", 4.0))),
            "rope_original_len": str(int(p["original_max_position_embeddings"])),
        }
    return out


def layer_types(cfg: dict, n_layers: int) -> list[str]:
    """`layer_types` of the config, else transformers' rule for Qwen2-style sliding windows (layers
    from `max_window_layers` on slide when `use_sliding_window`)."""
    types = cfg.get("layer_types")
    if types is None:
        slide = cfg.get("use_sliding_window") and cfg.get("sliding_window")
        first = get(cfg, "max_window_layers", n_layers)
        types = ["sliding_attention" if slide and i >= first else "full_attention" for i in range(n_layers)]
    refuse_unless(len(types) == n_layers, "layer_types", f"{len(types)} layer types for {n_layers} layers")
    for t in types:
        refuse_unless(t in ("full_attention", "sliding_attention"), "layer_types", f"layer type `{t}`")
    return list(types)
