"""The public API: `lt2dsl.compile`, `LT2Model`, its cache, graph, `generate` and `--emit fx`."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lt2dsl
from lt2dsl.cli import main
from lt2dsl.diagnostics import DiagnosticError
from lt2dsl.lowering import LT2Model
from lt2dsl.lowering.cache import Cache

from .util import call, lower, text, tokens

ROOT = Path(__file__).parents[2]
SRC = text(f"loop T=2 < {call('gdn')}; {call('swa')} >")


def test_import_lt2dsl_does_not_import_torch():
    code = "import sys, lt2dsl; assert callable(lt2dsl.compile); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_compile_text_defaults_to_the_model_dtype_and_runs():
    model = lt2dsl.compile(SRC, backend="reference")
    assert isinstance(model, LT2Model) and isinstance(model, torch.nn.Module)
    assert isinstance(model.graph_module, torch.fx.GraphModule)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # dtype = bf16 unless set
    logits = model(tokens(2, 5))
    assert logits.shape == (2, 5, 64) and logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


def test_compile_path_with_overrides_and_dtype(tmp_path):
    path = tmp_path / "m.lt2"
    path.write_text(SRC)
    model = lt2dsl.compile(path, backend="reference", dtype=torch.float32, loop_T=3, vocab=80)
    assert model.applications == 6 and model.config.vocab == 80
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert lt2dsl.compile(str(path), dtype="fp64").embed.weight.dtype == torch.float64


def test_compile_reports_program_errors_as_diagnostics():
    with pytest.raises(DiagnosticError):
        lt2dsl.compile(text("loop T=2 < gdnn >"))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"backend": "cuda"}, "backend"),
        ({"dtype": "int8"}, "dtype"),
        ({"dtype": torch.int64}, "floating-point"),
    ],
)
def test_compile_rejects_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        lt2dsl.compile(SRC, **kw)


def test_cache_grows_only_by_growing_kinds():
    model = lower(f"{call('gdn')}; full")
    cache = model.new_cache(1)
    assert isinstance(cache, Cache) and cache.nbytes() == 0
    model(tokens(1, 6), cache)
    after6 = cache.nbytes()
    model(tokens(1, 1), cache)
    # One more token: the full-attention k and v grow by HKV·d each (float64), the GDN state does not.
    assert cache.nbytes() - after6 == 2 * 2 * 16 * 8 and cache.seen == 7


def test_graph_shape_and_cache_plumbing():
    model = lower(f"loop T=2 < {call('gdn')}; {call('swa')} >")
    g = model.graph_module.graph
    nodes = list(g.nodes)
    assert [nd.name for nd in nodes if nd.op == "placeholder"] == ["input_ids", "cache", "cu_seqlens"]
    assert nodes[1].args == nodes[2].args == (None,)  # cache and cu_seqlens default to None
    calls = [nd for nd in nodes if nd.op == "call_function"]
    names = [getattr(nd.target, "__name__", "") for nd in calls]
    assert names[0] == "cache_pos" and names.count("cache_pos") == 1
    assert [nd.args[1] for nd, nm in zip(calls, names) if nm == "cache_entry"] == [0, 1, 2, 3]
    assert names.count("gated_delta_rule_core") == 2 and names.count("attention_core") == 2
    assert names[-1] == "cache_advance"
    g.eliminate_dead_code()  # the cache update is a side effect: it survives DCE
    assert any(getattr(nd.target, "__name__", "") == "cache_advance" for nd in g.nodes)


def test_moving_rebuilds_the_graph_and_copies_work():
    model = lower(f"{call('gdn')}; {call('swa')}")
    ids = tokens(1, 6)
    want = model(ids)
    model.float()
    assert model(ids).dtype == torch.float32
    model.double()
    torch.testing.assert_close(model(ids), want, rtol=1e-6, atol=1e-6)
    twin = copy.deepcopy(model)
    torch.testing.assert_close(twin(ids), model(ids), rtol=0, atol=0)
    with torch.no_grad():
        twin.embed.weight.add_(1.0)
    assert not torch.allclose(twin(ids), model(ids))  # the copy owns its weights


def test_generate_greedy_equals_repeated_full_forwards():
    model = lower(f"loop T=2 < {call('gdn')}; {call('swa')} >")
    prompt = tokens(2, 4)
    out = model.generate(prompt, max_new_tokens=5)
    assert out.shape == (2, 9) and torch.equal(out[:, :4], prompt)
    seq = prompt
    with torch.no_grad():
        for _ in range(5):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)
    assert torch.equal(model.generate(prompt, 5, temperature=0.7, top_k=1), seq)
    g1, g2 = (torch.Generator().manual_seed(7) for _ in range(2))
    a = model.generate(prompt, 6, temperature=1.0, top_k=5, generator=g1)
    assert torch.equal(a, model.generate(prompt, 6, temperature=1.0, top_k=5, generator=g2))
    assert model.training  # generate restores the mode


def test_generate_checks_the_prompt_ids():
    """The prompt is checked once, up front (the engine's steps read no id back from the device)."""
    model = lower(call("gdn"))
    with pytest.raises(ValueError, match="token ids must be in"):
        model.generate(torch.full((1, 2), model.config.vocab), 2)


def test_generate_checks_its_arguments():
    model = lower(call("swa"))
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(tokens(1, 2), -1)
    with pytest.raises(ValueError, match="head"):
        lower(call("swa"), head="none").generate(tokens(1, 2), 1)


def test_emit_fx_prints_the_graph_module_code(capsys):
    path = str(ROOT / "examples/lt2_hybrid_gdn_dsa.lt2")
    assert main(["compile", path, "--emit", "fx", "--no-fuse"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# lt2_gdn_dsa: torch.fx code") and "unfused" in out.splitlines()[0]
    assert "def forward(self, input_ids" in out and "cache_advance" in out
    assert out.count("gated_delta_rule_core(") == 4 * 18 and out.count("dsa_attend(") == 4 * 6
    # Fused by default: the header names the rules that fired and the code calls the fused ops.
    assert main(["compile", path, "--emit", "fx"]) == 0
    fused = capsys.readouterr().out
    assert "fused: gdn_gate x72" in fused.splitlines()[0]
    assert "gated_delta_rule_core(" not in fused and fused.count("gated_delta_rule_core_gates(") == 4 * 18
    assert "linear_split(" in fused and "add_rmsnorm(" in fused


def test_compile_fuses_by_default_and_fuse_false_turns_it_off():
    src = "loop T=2 < gdn; swa(window=8) >"
    kw = dict(dim=32, heads=2, vocab=64, dtype=torch.float64, backend="reference")
    torch.manual_seed(0)
    fused = lt2dsl.compile(src, **kw)
    torch.manual_seed(0)
    plain = lt2dsl.compile(src, fuse=False, **kw)
    assert "linear_split" in fused.graph_module.code and "linear_split" not in plain.graph_module.code
    ids = tokens(2, 7)
    torch.testing.assert_close(fused(ids), plain(ids), rtol=1e-10, atol=1e-10)
    fused.to(torch.float64)  # a move re-traces: the fusion must be re-applied
    assert "linear_split" in fused.graph_module.code


def test_graph_passes_rewrite_the_graph_and_survive_moves():
    model = lower(call("swa"))
    ids = tokens(1, 4)
    want = model(ids)
    seen = []

    def double_logits(gm):
        seen.append(gm)
        out = next(nd for nd in gm.graph.nodes if nd.op == "output")
        with gm.graph.inserting_before(out):
            doubled = gm.graph.call_function(torch.mul, (out.args[0], 2.0))
        out.args = (doubled,)
        gm.recompile()
        return gm

    model.graph_passes.append(double_logits)
    model.rebuild_graph()
    torch.testing.assert_close(model(ids), 2 * want, rtol=0, atol=0)
    model.float()
    torch.testing.assert_close(model(ids), (2 * want).float(), rtol=1e-6, atol=1e-6)
    assert len(seen) == 2  # applied again to the graph traced after the move


def test_whole_model_pickles_with_torch_save(tmp_path):
    """`torch.save(model)` must work (layers look their spec up instead of holding it)."""
    m = lt2dsl.compile(
        "loop T=2 < gdn; swa(window=8) >", dim=32, heads=2, vocab=64, dtype=torch.float32, backend="reference"
    )
    ids = torch.randint(0, 64, (1, 9))
    path = tmp_path / "m.pt"
    torch.save(m, path)
    back = torch.load(path, weights_only=False)
    assert torch.equal(back(ids), m(ids))
