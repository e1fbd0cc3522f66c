"""The estimate's kernel count of a decode step (`cost.estimate.decode_kernels`: the specs'
`decode_kernels` / `decode_once`, `block_decode_kernels`, the loops' and the step's own) equals
the launches the lowered model's engine step makes, counted on the CPU by
`bench/decode_launches.py` (Triton under the interpreter, launches and projection GEMMs stubbed
and counted). Every example and a set of variants that each change one thing the count depends
on (norm, MLP, conv, attention options, par, loops, exit gates, DSA's split paths). Toy sizes,
B = 1; the estimate is asked at the engine's context (prompt + 1 token)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lt2dsl.cost.estimate import EstimateOptions, decode_kernels, estimate
from lt2dsl.cost.hardware import load_hardware
from lt2dsl.env import triton_interpreting
from lt2dsl.ir.specs import dsa as dsa_spec
from lt2dsl.ir.specs import nsa as nsa_spec
from lt2dsl.ir.specs.common import DECODE_SMS
from lt2dsl.lowering import resolve_source

ROOT = Path(__file__).resolve().parents[2]
# 16 heads: every example's kv_heads (up to 16) divides them; heads of 16 (narrower ones copy q
# and k before the RoPE kernel, which no real model's do)
TOY = {"dim": 64, "heads": 16, "head_dim": 16, "vocab": 256}
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.lt2"))

HEAD = "model m {{\n dim = 64\n vocab = 256\n heads = 4\n head_dim = 16\n max_len = 64\n {}\n {}\n}}"
SW = "mlp = swiglu(hidden=128)"
VARIANTS = {
    "gdn": (SW, "gdn * 2"),
    "mlp none": ("mlp = none", "gdn * 2"),
    "gelu": ("mlp = gelu(hidden=128)", "gdn * 2"),
    "geglu": ("mlp = geglu(hidden=128)", "gdn * 2"),
    "layernorm": (SW + "\n norm = layernorm", "gdn * 2"),
    "offset rmsnorm": (SW + "\n norm = rmsnorm(offset=true)", "gdn * 2"),
    "offset, final norm per iteration": (
        SW + "\n norm = rmsnorm(offset=true)",
        "loop T=3, final_norm=true < gdn >",
    ),
    "sandwich": (SW + "\n norm = sandwich", "gdn * 2"),
    "no convs": (SW, "gdn(conv=0); deltanet(conv=0); kda(conv=0)"),
    "attention options": (SW, "full(qk_norm=true); full(bias=true); full(gate=headwise); full(rope_dim=8)"),
    "swa": (SW, "swa(window=16) * 2"),
    "par": (SW, "par(gdn, swa(window=16)) * 2"),
    "dsa and full share a RoPE table": (SW, "dsa(topk=4, index_dim=64); full"),
    "dsa, small top-k": (SW, "dsa(topk=4, index_dim=32) * 2"),
    "dsa, split sparse attention": (SW, "dsa(topk=256, index_dim=32) * 2"),
    "nsa": (SW, "nsa(block=8, cmp_block=4, stride=2, select=2, window=4, kv_heads=2) * 2"),
    "final norm per iteration": (SW, "loop T=3, final_norm=true < gdn >"),
    "inject add, nested": (SW, "loop T=2, inject=add < gdn; loop T=3, inject=add < swa(window=8) > >"),
    "inject concat": (SW, "loop T=3, inject=concat < gdn >"),
    "exit gate": (SW, "loop T=3, exit=gate(threshold=0.9) < gdn; full >"),
    "exit gate, final norm per iteration": (
        SW,
        "loop T=2, final_norm=true, exit=gate(threshold=0.9) < gdn >",
    ),
}
pytestmark = pytest.mark.skipif(
    not triton_interpreting(), reason="counts launches under Triton's CPU interpreter"
)


@pytest.fixture
def gpu_split_rule(monkeypatch):
    """The sparse attentions' split decisions as the card takes them: the kernels' own DSA
    `split_count` and NSA `cmp_splits`, run with the card's settings (not the interpreter's
    small-grid rules, DECODE_SMS SMs, the card's tile sizes), so the count follows the GPU's
    kernels."""
    from types import SimpleNamespace
    from unittest import mock

    import torch

    from lt2dsl.kernels.dsa import triton_attn
    from lt2dsl.kernels.nsa import triton_decode

    card = SimpleNamespace(multi_processor_count=DECODE_SMS)

    def on_card(module, rule, tile):
        def run(programs, n, _interpreter_tile, device):
            with (
                mock.patch.object(module, "triton_interpreting", lambda: False),
                mock.patch.object(torch.cuda, "get_device_properties", lambda _: card),
            ):
                return rule(programs, n, tile(), device)

        return run

    def dsa_tile():
        return triton_attn._cfg(torch.bfloat16)["BK"]

    def nsa_tile():
        return triton_decode.select_tile(128)

    dsa = on_card(triton_attn, triton_attn.split_count, dsa_tile)
    nsa = on_card(triton_decode, triton_decode.cmp_splits, nsa_tile)
    monkeypatch.setattr(triton_attn, "split_count", dsa)
    monkeypatch.setattr(triton_decode, "cmp_splits", nsa)


def counted(src: str, toy: dict) -> int:
    import torch

    from bench import decode_launches as dl
    from lt2dsl import compile as compile_model

    model = compile_model(src, backend="triton", dtype=torch.bfloat16, device="cpu", **toy).eval()
    _ = model.graph_module
    with torch.no_grad(), dl.stubbed_kernels() as stubs:
        return sum(dl.count_step(dl.engine_step(model), stubs).values())


def estimated(src: str, toy: dict) -> int:
    from bench import decode_launches as dl

    return decode_kernels(resolve_source(src, toy), 1, dl.PROMPT + 1)


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_step_launches_what_the_estimate_counts(name, gpu_split_rule):
    src = str(ROOT / "examples" / f"{name}.lt2")
    assert estimated(src, TOY) == counted(src, TOY)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_step_launches_what_the_estimate_counts(name, gpu_split_rule):
    src = HEAD.format(*VARIANTS[name])
    assert estimated(src, {}) == counted(src, {})


def test_dsa_sliced_select_adds_four_launches(gpu_split_rule, monkeypatch):
    """The sliced top-k select (5 launches for 1) of long rows, with its threshold lowered to the
    toy cache's length in both the kernel and the spec."""
    from lt2dsl.kernels.dsa import triton_topk

    monkeypatch.setattr(triton_topk, "SPLIT_MIN_KW", 8)
    monkeypatch.setattr(dsa_spec, "SPLIT_MIN_KW", 8)
    src = HEAD.format(SW, "dsa(topk=256, index_dim=32) * 2")
    n = counted(src, {})
    assert estimated(src, {}) == n
    monkeypatch.setattr(dsa_spec, "SPLIT_MIN_KW", 10**9)
    assert estimated(src, {}) == n - 2 * 4


def test_nsa_split_compressed_branch_adds_two_launches(gpu_split_rule, monkeypatch):
    """The compressed branch split over programs, the blocks chosen in slices and then for the row
    (3 launches for 1; two layers: 4 more), with its threshold
    lowered so the toy cache's compressed keys pass it (the kernel forced to two splits: its own
    count would keep a buffer this short in one)."""
    from lt2dsl.kernels.nsa import triton_decode

    monkeypatch.setattr(triton_decode, "cmp_splits", lambda programs, nc, bn, device: 2)
    monkeypatch.setattr(nsa_spec, "CMP_SPLIT_TILES", 0)
    src = HEAD.format(SW, "nsa(block=8, cmp_block=4, stride=2, select=2, window=4, kv_heads=2) * 2")
    n = counted(src, {})
    assert estimated(src, {}) == n
    monkeypatch.setattr(nsa_spec, "CMP_SPLIT_TILES", 10**9)
    assert estimated(src, {}) == n - 4


def test_split_thresholds_are_the_kernels(monkeypatch):
    import torch

    from lt2dsl.kernels.dsa import triton_attn, triton_topk
    from lt2dsl.kernels.nsa import triton_decode

    assert dsa_spec.SPLIT_MAX_ROWS == triton_topk.SPLIT_MAX_ROWS
    assert dsa_spec.SPLIT_MIN_KW == triton_topk.SPLIT_MIN_KW
    assert nsa_spec.CMP_SPLIT_TILES == triton_decode.CMP_SPLIT_TILES
    # the card's settings, not the interpreter's
    monkeypatch.setattr(triton_attn, "triton_interpreting", lambda: False)
    monkeypatch.setattr(triton_decode, "triton_interpreting", lambda: False)
    assert 2 * triton_attn._cfg(torch.bfloat16)["BK"] == dsa_spec.SPARSE_SPLIT_MIN_TOPK
    assert (triton_decode.select_tile(128), triton_decode.select_tile(256)) == (64, 32)


def test_the_roofline_charges_each_kernel_the_cards_kernel_s():
    """decode step = max(FLOPs, bytes) time + kernels × kernel_s; a preset without kernel_s (the
    datasheet's) leaves the roofline as it was."""
    src = str(ROOT / "examples" / "lt2_hybrid_gdn_dsa.lt2")
    model = resolve_source(src, {})
    hw = load_hardware("h100")
    slow = hw.model_copy(update={"kernel_s": 2e-6})
    for B, L in ((1, 4096), (8, 32768)):
        base = estimate(model, EstimateOptions(hw=hw, batch=B, seq=L)).roofline
        ro = estimate(model, EstimateOptions(hw=slow, batch=B, seq=L)).roofline
        kernels = decode_kernels(model, B, L)
        assert base.decode_kernels == ro.decode_kernels == kernels > 1000
        assert base.decode_launch_s == 0.0
        assert ro.decode_launch_s == pytest.approx(kernels * 2e-6)
        assert ro.decode_step_s == pytest.approx(base.decode_step_s + kernels * 2e-6)
        assert ro.decode_tokens_per_s == pytest.approx(B / ro.decode_step_s)
    # the sliced select's four more launches a DSA application at 4k keys, none at 4,095
    assert decode_kernels(model, 1, 4096) - decode_kernels(model, 1, 4095) == 24 * 4
