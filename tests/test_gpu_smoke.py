"""bench/gpu_smoke.py (`make gpu-smoke`) at its CPU size, so the GPU smoke run cannot rot between
GPU sessions: every example and the 12-layer GDN model pass through the reference backend."""

from __future__ import annotations

import json

import torch

from bench import gpu_smoke


def test_toy_smoke_run_passes_every_example_and_writes_json(tmp_path, capsys):
    out = tmp_path / "smoke.json"
    assert gpu_smoke.main(["--size", "toy", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    stems = sorted(p.stem for p in (gpu_smoke.ROOT / "examples").glob("*.lt2"))
    assert [r["name"] for r in data["results"]] == [*stems, "gdn12-toy"]
    for r in data["results"]:
        assert r["ok"] and r["decode_error"] <= r["decode_tol"] and r["generated"] == gpu_smoke.DECODE_STEPS
    assert data["card"].startswith("cpu")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("cpu") and len(printed) == len(stems) + 3


class _DriftingModel(torch.nn.Module):
    """Logits from the token ids, off by 1 on every call that carries a cache: a decode path that
    disagrees with the forward."""

    def forward(self, ids, cache=None):
        logits = torch.nn.functional.one_hot(ids, 8).float()
        return logits + (1.0 if cache is not None else 0.0)

    def new_cache(self, batch):
        return object()


def test_decode_error_catches_a_decode_path_that_differs():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    assert gpu_smoke.decode_error(_DriftingModel(), ids, 3) > 1.0
    r = gpu_smoke.Result("m", error="prefill + decode differs")
    assert gpu_smoke.line(r).startswith("FAIL m")
