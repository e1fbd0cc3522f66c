"""`bench/decode_compare.py` (GPU only) on the CPU: its model is the issue's shape, its ratio bookkeeping."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import lt2dsl

PATH = Path(__file__).parents[2] / "bench" / "decode_compare.py"


def load():
    spec = importlib.util.spec_from_file_location("decode_compare", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gdn_model_has_the_peers_shape():
    """237.7M parameters: the peer's GatedDeltaNetForCausalLM at dim 1024, 12 layers (issue 35)."""
    model = lt2dsl.compile(load().GDN12, device="meta")
    assert round(sum(p.numel() for p in model.parameters()) / 1e5) == 2377


def test_speed_ratio_per_batch_against_the_estimate():
    """Rows carry the example stems as model names, as `looped` writes them; B=8's Ouro ran out of
    memory, so its measured ratio is None while the estimate stands."""
    module = load()
    hybrid, ouro = module.LOOPED
    rows = [
        {"model": hybrid, "batch": 1, "ctx": 8192, "tok_s": 10.0, "estimate_tok_s": 120.0},
        {"model": ouro, "batch": 1, "ctx": 8192, "tok_s": 2.0, "estimate_tok_s": 20.0},
        {"model": hybrid, "batch": 8, "ctx": 8192, "tok_s": 40.0, "estimate_tok_s": 600.0},
        {"model": ouro, "batch": 8, "ctx": 8192, "oom": True, "estimate_tok_s": 100.0},
        {"model": hybrid, "batch": 1, "ctx": 4096, "tok_s": 11.0, "estimate_tok_s": 130.0},
    ]
    assert module.ratio_at(rows, 8192) == [
        {"batch": 1, "measured": 5.0, "estimate": 6.0},
        {"batch": 8, "measured": None, "estimate": 6.0},
    ]


def test_a_failing_peer_is_a_recorded_row_not_the_end_of_the_comparison(monkeypatch):
    """A peer raising inside its own stack (HF's compiled static cache did, on torch 2.11) leaves its
    row with the error and NaN, and the rows after it still run."""
    module = load()
    monkeypatch.setattr(module, "lt2dsl_rate", lambda ids, new: (100.0, 7))

    def broken(ids, new):
        raise RuntimeError("output of CUDAGraphs overwritten\nstack")

    peers = (("broken", broken), ("after", lambda ids, new: (50.0, 5)))
    rows = module.gdn_vs_peers(16, 4, skip_peers=False, peers=peers, device="cpu")
    assert rows["broken"]["error"] == "RuntimeError: output of CUDAGraphs overwritten"
    assert rows["broken"]["tok_s"] != rows["broken"]["tok_s"]
    assert rows["after"] == {"tok_s": 50.0, "params": 5, "lt2dsl_speedup": 2.0, "error": None}
    assert rows["lt2dsl"]["error"] is None
