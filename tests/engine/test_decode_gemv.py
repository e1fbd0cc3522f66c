"""The opt-in rule `decode_gemv` end to end (CPU interpreter here): a bf16 GDN + DSA model whose
decode steps run the GEMV kernels gives the eager path's greedy tokens, its static-cache logits
stay as near the float64 truth as one forward, and the kernels do run in the engine's step (and
only there: prefill and a dynamic cache keep the unfused nodes)."""

from __future__ import annotations

import collections

import pytest
import torch

from lt2dsl.engine import Engine
from lt2dsl.kernels.gemv import triton_gemv
from lt2dsl.lowering import compile_model, fx_passes

from ..lowering.util import call, resolved, tokens
from .util import assert_near_the_truth, eager_greedy, jitter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BODY = f"loop T=2 < {call('gdn')}; {call('dsa')} >"
# sandwich blocks (Ouro's): the residual add-norms are `norm_add_rmsnorm`s
SANDWICH = {"body": f"loop T=2 < {call('gdn')}; {call('full')} >", "norm": "sandwich"}


class Launches(list):
    def __init__(self):
        super().__init__()
        self.forms = collections.Counter()

    def clear(self):
        super().clear()
        self.forms.clear()


def gemv_model(opt_in=("decode_gemv",), fuse: bool = True, body: str = BODY, **settings):
    torch.manual_seed(0)
    kw = {"backend": "triton", "dtype": torch.bfloat16, "device": DEVICE, "fuse": fuse, "opt_in": opt_in}
    # jittered: the norms' γ (initialised to ones) must take part in what the tests compare
    model = jitter(compile_model(resolved(body, **settings), **kw).eval(), scale=0.2)
    model.build_graph()  # traced and fused here: `fx_passes.COUNTERS` are this model's
    return model


@pytest.fixture
def launches(monkeypatch):
    """GEMV kernel launches by the number of rows they took; `launches.forms` their prologues."""
    seen = Launches()
    real = triton_gemv.gemv_fwd

    def spy(x2, *args, **kw):
        seen.append(x2.shape[0])
        seen.forms[next((k for k in ("gated", "sandwich") if kw.get(k) is not None), "other")] += 1
        return real(x2, *args, **kw)

    monkeypatch.setattr(triton_gemv, "gemv_fwd", spy)
    return seen


def test_engine_greedy_tokens_equal_the_eager_path(launches):
    model = gemv_model()
    # 2 iterations x 2 blocks: o_proj and down_proj of each application but the last down_proj
    assert fx_passes.COUNTERS["decode_gemv"] == 7
    assert "proj_add_norm_split" in model.graph_module.code
    ids = tokens(2, 4).to(DEVICE)
    got = Engine(model, capture=False).generate(ids, 4)
    # 3 decode steps, each 7 fused nodes of two launches, 2 rows each; the prefill launches none;
    # GDN's o_proj (one per step and iteration) takes its gated norm in the prologue
    assert launches == [2] * (3 * 7 * 2) and launches.forms["gated"] == 3 * 2
    launches.clear()
    assert torch.equal(got, eager_greedy(model, ids, 4))
    assert not launches, "the dynamic cache's steps ran the decode kernels"


def test_sandwich_blocks_decode_the_eager_paths_tokens(launches):
    model = gemv_model(**SANDWICH)
    # as in the pre-norm model: o_proj and down_proj of each application but the last down_proj
    assert fx_passes.COUNTERS["decode_gemv"] == 7 and fx_passes.COUNTERS["norm_add_rmsnorm"] == 8
    ids = tokens(1, 4).to(DEVICE)
    got = Engine(model, capture=False).generate(ids, 3)
    assert launches == [1] * (2 * 7 * 2)  # 2 decode steps, 7 nodes of two launches, 1 row
    # each node's second GEMV forms the norm-add-norm; GDN's o_proj its gated norm
    assert launches.forms == {"sandwich": 2 * 7, "gated": 2 * 2, "other": 2 * 5}
    launches.clear()
    assert torch.equal(got, eager_greedy(model, ids, 3))
    assert not launches


def test_static_cache_logits_stay_near_the_truth(launches):
    model = gemv_model()
    seq = tokens(2, 9).to(DEVICE)
    errs = assert_near_the_truth(model, seq, 6)
    assert launches and set(launches) == {2}, "the static steps ran no decode GEMV"
    assert errs["static"] <= 1.25 * errs["forward"] + 0.01


def test_the_rule_is_off_unless_named():
    assert "proj_add_norm_split" not in gemv_model(opt_in=()).graph_module.code
    assert fx_passes.COUNTERS["decode_gemv"] == 0
    with pytest.raises(ValueError, match="opt-in fusion rule"):
        gemv_model(opt_in=("decode_gemvv",))
    with pytest.raises(ValueError, match="fuse=False"):
        gemv_model(fuse=False)
