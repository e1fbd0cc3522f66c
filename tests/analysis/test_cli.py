"""`lt2dsl analyze`: the Toeplitz and state tables from a `.lt2` file and safetensors weights."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

import lt2dsl
from lt2dsl.cli import main

MODEL = """model m {
  dim = 16
  vocab = 12
  heads = 2
  max_len = 32
  dtype = fp32
  tmm(heads=2)
  loop T=2 < gdn(expand_v=1) >
}
"""


def test_analyze_prints_both_tables_and_json(tmp_path, capsys):
    torch.manual_seed(0)
    model = lt2dsl.compile(MODEL, backend="reference")
    with torch.no_grad():
        model.blocks[0].mixers[0].w.zero_()
        model.blocks[0].mixers[0].w[0, :, 1] = 1.0  # a(z) = z in both heads: winding 1
    (tmp_path / "m.lt2").write_text(MODEL)
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    argv = ["analyze", str(tmp_path), "--model", str(tmp_path / "m.lt2"), "--length", "24", "--probes", "6"]
    assert main([*argv, "--json", "-"]) == 0
    got = json.loads(capsys.readouterr().out)
    (layer,) = got["toeplitz"]
    assert [s["winding"] for s in layer["symbols"]] == [1, 1] and layer["index"] == -16
    assert [(r["iteration"], r["head"]) for r in got["states"]] == [("0", 0), ("0", 1), ("1", 0), ("1", 1)]
    assert got["length"] == 24 and all(0 <= r["receptive_field"] <= 24 for r in got["states"])
    assert (
        main(
            [*argv, "--task", "mqar", "--data", "vocab=12", "--data", "num_kv_pairs=2", "--data", "length=16"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Fredholm index" in out and "receptive field" in out and "-16" in out
    assert main([*argv, "--task", "copy", "--data", "length=40"]) == 1
    assert capsys.readouterr().err == "error: the model's vocab (12) is smaller than the task's (32)\n"
    assert main([*argv, "--task", "copy", "--data", "length=20", "--data", "vocab=12"]) == 1
    assert "rows have 40 tokens but the model's max_len is 32" in capsys.readouterr().err
