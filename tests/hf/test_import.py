"""Import parity for the transformer families: a tiny random `transformers` model saved to a temp
folder, imported, then compared on logits (fp32, 1e-5 relative) and greedy tokens (exact)."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bench.hf_layouts import (  # noqa: E402
    OURO_1P4B,
    VOCAB,
    ouro_config,
    ouro_shapes,
    random_state,
    write_checkpoint,
)
from bench.hf_reference import ouro_logits  # noqa: E402
from lt2dsl.hf import from_pretrained, import_checkpoint  # noqa: E402

from .util import greedy, prompt, rel_err  # noqa: E402

SMALL = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)

CASES = {
    # Llama 3: llama3 RoPE scaling whose original length (16) puts frequencies in all three bands
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
            attention_bias=True,
        ),
    ),
    # SmolLM2 is LlamaForCausalLM with tied embeddings and MHA
    "smollm2": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True, num_key_value_heads=4)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(head_dim=8)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8, tie_word_embeddings=True)),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            num_hidden_layers=4,
            head_dim=8,
            query_pre_attn_scalar=8,
            sliding_window=3,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
        ),
    ),
}


def hf_model(case: str):
    cfg_cls, model_cls, extra = CASES[case]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(**(SMALL | extra))
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases: a misplaced one changes the logits
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(0, 0.3)
    model.generation_config.eos_token_id = None
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    ref = hf_model(case)
    ref.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path, dtype=torch.float32, backend="reference").eval()
    ids = prompt()
    with torch.no_grad():
        assert rel_err(ours(ids), ref(ids).logits) < 1e-5
        assert torch.equal(ours.generate(ids, 4), ref.generate(ids, max_new_tokens=4, do_sample=False))


def test_sharded_checkpoint_imports_like_one_file(tmp_path):
    ref = hf_model("qwen2")
    one_dir, shard_dir = tmp_path / "one" / "ckpt", tmp_path / "shards" / "ckpt"
    ref.save_pretrained(one_dir)
    ref.save_pretrained(shard_dir, max_shard_size="20KB")
    assert (shard_dir / "model.safetensors.index.json").is_file()
    one, shards = import_checkpoint(one_dir), import_checkpoint(shard_dir)
    assert one.text == shards.text
    assert all(torch.equal(one.state[k], shards.state[k]) for k in one.state)


@pytest.mark.parametrize("threshold", [1.0, 0.5])
def test_ouro_layout_matches_its_forward(threshold, tmp_path):
    cfg = ouro_config(early_exit_threshold=threshold)
    state = random_state(ouro_shapes(cfg))
    write_checkpoint(tmp_path, cfg, state)
    ours = from_pretrained(tmp_path, dtype=torch.float32, backend="reference").eval()
    ids = prompt()

    def ref(x):
        return ouro_logits(state, cfg, x)

    with torch.no_grad():
        assert rel_err(ours(ids), ref(ids)) < 1e-5
        assert torch.equal(ours.generate(ids, 4), greedy(ref, ids, 4))


def test_ouro_1p4b_config_gives_the_example(tmp_path):
    """Ouro-1.4B's config imports to `examples/ouro_1p4b.lt2` (1,434,652,673 stored parameters)."""
    from pathlib import Path

    from lt2dsl.cost.estimate import model_weights
    from lt2dsl.frontend import load_or_raise
    from lt2dsl.hf.checkpoint import open_checkpoint
    from lt2dsl.hf.importer import program_text, read_plan

    write_checkpoint(tmp_path / "ouro_1p4b", OURO_1P4B, {})
    plan = read_plan(open_checkpoint(tmp_path / "ouro_1p4b"))
    _, imported = program_text(plan, "Ouro-1.4B")
    example = load_or_raise(Path(__file__).parents[2] / "examples" / "ouro_1p4b.lt2").model
    assert imported == example
    assert sum(math.prod(s) for s in model_weights(example).values()) == 1_434_652_673


def test_ouro_without_threshold_returns_the_last_iteration(tmp_path):
    cfg = ouro_config(early_exit_threshold=None)
    state = random_state(ouro_shapes(cfg))
    write_checkpoint(tmp_path, cfg, state)
    imported = import_checkpoint(tmp_path)
    assert "exit=" not in imported.text and "exit gate is unused" in imported.text
    ours = from_pretrained(tmp_path, dtype=torch.float32, backend="reference").eval()
    ids = prompt()
    with torch.no_grad():  # a threshold above every cumulative p selects the last step, as None does
        assert rel_err(ours(ids), ouro_logits(state, cfg | {"early_exit_threshold": 2.0}, ids)) < 1e-5
