"""`lt2dsl import`: the written program and weights, and the refusals (exit 1, a diagnostic naming
the config field, never a traceback)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

import lt2dsl
from lt2dsl.cli import main
from lt2dsl.hf import Refused, import_checkpoint
from lt2dsl.hf.checkpoint import iter_tensors, save_safetensors

from .test_import import hf_model
from .util import prompt, rel_err


@pytest.fixture
def qwen3_dir(tmp_path):
    model = hf_model("qwen3")
    model.save_pretrained(tmp_path / "qwen3")
    return tmp_path / "qwen3", model


def test_import_writes_formatted_program_and_loadable_weights(qwen3_dir, tmp_path, capsys):
    src, ref = qwen3_dir
    out, weights = tmp_path / "m.lt2", tmp_path / "w.safetensors"
    assert main(["import", str(src), "-o", str(out), "--weights", str(weights)]) == 0
    text = out.read_text()
    assert text.startswith("# Imported from qwen3 (qwen3)")
    assert main(["fmt", "--check", str(out)]) == 0  # already in the printer's form
    model = lt2dsl.compile(out, backend="reference", dtype="fp32").eval()
    model.load_state_dict(dict(iter_tensors([weights])), strict=True)
    ids = prompt()
    with torch.no_grad():
        assert rel_err(model(ids), ref(ids).logits) < 1e-5


def test_import_to_stdout(qwen3_dir, capsys):
    assert main(["import", str(qwen3_dir[0])]) == 0
    assert "qk_norm=true" in capsys.readouterr().out


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"num_experts": 8, "model_type": "qwen3_moe"}, "num_experts"),
        ({"model_type": "mamba"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}, "rope_parameters"),
    ],
    ids=["moe", "model_type", "activation", "yarn"],
)
def test_unsupported_feature_is_a_diagnostic_naming_the_field(qwen3_dir, capsys, changes, field):
    folder = qwen3_dir[0]
    edit_config(folder, **changes)
    assert main(["import", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error[E1001]") and f'"{field}":' in err and "Traceback" not in err
    with pytest.raises(Refused) as info:
        import_checkpoint(folder)
    assert info.value.field == field


def test_weights_that_do_not_match_the_config_are_refused(qwen3_dir, capsys):
    folder = qwen3_dir[0]
    edit_config(folder, intermediate_size=64)
    assert main(["import", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error[E1002]: `model.layers.0.mlp.") and "the config implies [" in err
    edit_config(folder, intermediate_size=48)
    state = dict(iter_tensors([folder / "model.safetensors"]))
    del state["model.layers.1.self_attn.k_norm.weight"]
    save_safetensors(state, folder / "model.safetensors")
    assert main(["import", str(folder)]) == 1
    assert "the checkpoint lacks weights: `model.layers.1.self_attn.k_norm.weight`" in capsys.readouterr().err


def test_a_missing_folder_is_a_usage_error(tmp_path, capsys):
    assert main(["import", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith("error: cannot read")


def test_a_config_without_a_needed_key_is_a_diagnostic_naming_it(qwen3_dir, capsys):
    folder = qwen3_dir[0]
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["hidden_size"]
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    assert main(["import", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error[E1002]: config.json has no `hidden_size`, which a `qwen3` config gives")
    assert "Traceback" not in err and "E9999" not in err
