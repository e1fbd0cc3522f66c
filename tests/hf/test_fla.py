"""Import parity for the peer's (fla) families: GatedDeltaNet (with hybrid attention), DeltaNet, KDA
and GLA. fla's Triton kernels and its flash-attn layers do not run on the CPU, so each checkpoint
is laid out by hand from fla's config fields and weight names (`fla/models/*/configuration_*.py`,
`fla/layers/*.py`) with random weights, and compared against `reference.fla_logits`, an
independent step-by-step forward of fla's modules (no lt2dsl code): logits within 1e-5
relative and greedy tokens equal."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("safetensors")

from lt2dsl.hf import from_pretrained

from .reference import fla_logits
from .util import VOCAB, greedy, prompt, random_state, rel_err, write_checkpoint

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


CASES = {
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
    model_type, extra = CASES[kind]
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


@pytest.mark.parametrize("kind", list(CASES))
def test_fla_family_matches_reference(kind, tmp_path):
    cfg, state = fla_checkpoint(kind, tmp_path)
    ours = from_pretrained(tmp_path, dtype=torch.float32, backend="reference").eval()
    ids = prompt()

    def ref(x):
        return fla_logits(state, cfg, x, kind)

    with torch.no_grad():
        assert rel_err(ours(ids), ref(ids)) < 1e-5
        assert torch.equal(ours.generate(ids, 3), greedy(ref, ids, 3))


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
