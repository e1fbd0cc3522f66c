"""Each fusion rule on tiny float64 models of every mixer kind that has its pattern, loops included:
the four checks of style.md R11 (fired, fused op in the code and the pair gone, outputs and
gradients equal to the unfused graph), plus the rule's pattern / replacement pair on tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lt2dsl.lowering import functional
from lt2dsl.lowering.fx_passes import RULES
from lt2dsl.lowering.fx_passes.manager import is_add

from ..util import call
from .helpers import check_fusion


def norm_of_add(gm: torch.fx.GraphModule) -> bool:
    """An `nn.RMSNorm` call whose input is an add: the unfused add-norm pair."""
    for n in gm.graph.nodes:
        if n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.RMSNorm) and is_add(n.args[0]):
            return True
    return False


def short_convs(count: int):
    def check(gm: torch.fx.GraphModule) -> bool:
        convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is functional.short_conv]
        return len(convs) != count

    check.__name__ = f"short_conv count != {count}"
    return check


GDN, KDA, DN = call("gdn"), call("kda"), call("deltanet")
FULL, SWA, DSA = call("full"), call("swa"), call("dsa")
MAMBA = call("mamba2")


def branch_norm(gm: torch.fx.GraphModule) -> bool:
    """An `nn.RMSNorm` call read by an add: a sandwich block's branch norm unfused."""
    norms = [
        n
        for n in gm.graph.nodes
        if n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.RMSNorm)
    ]
    return any(is_add(u) for n in norms for u in n.users)


CASES = {
    # rule: [(body, fused op in the code, what must be gone[, model settings])]
    "norm_add_rmsnorm": [
        (FULL, "fused_norm_add_rmsnorm(", [norm_of_add, branch_norm], {"norm": "sandwich"}),
        (
            f"loop T=2, final_norm=true < {GDN}; {DSA} >",
            "fused_norm_add_rmsnorm(",
            [norm_of_add, branch_norm],
            {"norm": "sandwich"},
        ),
    ],
    "add_rmsnorm": [
        (FULL, "fused_add_rmsnorm(", [norm_of_add]),
        (f"loop T=2 < {GDN}; {SWA} >", "fused_add_rmsnorm(", [norm_of_add]),
        (f"loop T=2, final_norm=true, inject=add < {DSA} >", "fused_add_rmsnorm(", [norm_of_add]),
    ],
    "norm_proj": [
        (GDN, "fused_linear_split(", [".q_proj(", ".a_proj(", ".g_proj(", ".gate_proj("]),
        (DSA, "fused_linear_split(", [".q_proj(", ".idx_q(", ".idx_w(", ".g_proj("]),
        (call("mlstm"), "fused_concat_biases(", [".q_proj(", ".igate(", ".ogate("]),
        (f"loop T=2 < par({GDN}, {SWA}) >", "fused_linear_split(", [".q_proj(", ".up_proj("]),
        (call("full", "bias=true"), "fused_concat_biases(", [".q_proj(", ".v_proj("]),
    ],
    "gdn_gate": [
        (GDN, "fused_gdn_gate(", ["softplus", "torch.sigmoid", "exp()"]),
        (call("gdn", "neg_eigval=true"), "beta_scale = 2.0", ["softplus", "torch.sigmoid"]),
        (f"loop T=2 < {GDN}; {FULL} >", "fused_gdn_gate(", ["softplus", "torch.sigmoid"]),
    ],
    "gdn_gate_core": [
        (GDN, "leaves_gated_delta_rule_core_gates(", ["fused_gdn_gate(", "recurrent_gated_delta_rule_core("]),
        (call("gdn", "neg_eigval=true"), "beta_scale = 2.0", ["fused_gdn_gate(", "softplus"]),
        (f"loop T=2 < {GDN}; {FULL} >", "l2norm = True", ["fused_gdn_gate("]),
    ],
    "conv_silu_l2norm": [
        (GDN, "head_dims = (16, 16, 0)", ["functional_recurrent_gated_delta_rule_core(", short_convs(0)]),
        (DN, "leaves_delta_rule_core_normed(", ["functional_recurrent_delta_rule_core(", short_convs(0)]),
        (KDA, "leaves_conv_silu_group_cached(", ["functional_recurrent_kda_core(", short_convs(0)]),
        (f"loop T=2 < {GDN} >", "leaves_gated_delta_rule_core_normed(", [short_convs(0)]),
    ],
    "conv_silu": [
        (GDN, "leaves_conv_silu_cached(", ["functional_short_conv("]),
        (MAMBA, "leaves_conv_silu_cached(", ["functional_short_conv("]),
        (f"loop T=2 < {DN} >", "leaves_conv_silu_cached(", ["functional_short_conv("]),
    ],
    "gated_norm_proj": [
        (GDN, "fused_gated_rmsnorm_linear(", [".o_norm(", ".o_proj("]),
        (call("gdn", "gate=false"), "act = None", [".o_norm(", ".o_proj("]),
        (call("deltanet", "gate=true"), "act = 'silu'", [".o_norm(", ".o_proj("]),
        (KDA, "fused_gated_rmsnorm_linear(", [".o_norm(", ".o_proj("]),
        (call("gla"), "fused_gated_rmsnorm_linear(", [".g_norm(", ".o_proj("]),
        (call("mamba2", "groups=2"), "norm_before_gate = False", [".norm(", ".out_proj("]),
        (f"loop T=2 < {call('retnet')} >", "fused_gated_rmsnorm_linear(", [".o_proj("]),
    ],
    "rope_cache": [
        (FULL, "leaves_rope_append_cached(", ["functional_rope_pair(", "functional_append_cache("]),
        (SWA, "keep = 4", ["functional_rope_pair(", "functional_append_cache("]),
        (DSA, "norm_eps = 1e-06", ["functional_rope_pair(", "functional_append_cache(", "idx_k_norm("]),
        (f"loop T=2 < {GDN}; {DSA} >", "leaves_rope_append_cached(", ["functional_append_cache("]),
    ],
    "dsa_w_scale": [
        (DSA, "w_scale = 0.7071067811865476", [" * 0.7071067811865476"]),
        (f"loop T=2 < {GDN}; {DSA} >", "w_scale = 0.7071067811865476", [" * 0.7071067811865476"]),
    ],
    "swiglu": [
        (FULL, "fused_swiglu(", ["functional.silu("]),
        (f"loop T=2 < {GDN}; {SWA} >", "fused_swiglu(", ["functional.silu("]),
    ],
}

PARAMS = [
    pytest.param(rule, *case[:3], case[3] if len(case) > 3 else {}, id=f"{rule}-{i}-{case[0][:24]}")
    for rule, cases in CASES.items()
    for i, case in enumerate(cases)
]


def test_every_rule_has_cases():
    assert set(CASES) == set(RULES)


@pytest.mark.parametrize(("rule", "body", "fused_op", "absent", "settings"), PARAMS)
def test_rule_four_checks(rule, body, fused_op, absent, settings):
    check_fusion(body, rule, fused_op, absent, **settings)


def _inputs(rule: str, g: torch.Generator):
    """(args, kwargs) of the rule's pattern / replacement pair, float64."""

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64)

    B, T = 2, 5
    return {
        "add_rmsnorm": ((r(B, T, 8), r(B, T, 8), r(8), 1e-6), {}),
        "norm_add_rmsnorm": ((r(B, T, 8), r(B, T, 8), r(8), 1e-5, r(8), 1e-6), {}),
        "norm_proj": ((r(B, T, 8), [r(3, 8), r(5, 8)], [r(3), None]), {}),
        "gdn_gate": ((r(B, T, 3) * 4, r(B, T, 3), r(3), r(3), 2.0, torch.float64), {}),
        "gdn_gate_core": (
            (r(B, T, 1, 4), F.normalize(r(B, T, 1, 4), dim=-1), r(B, T, 2, 3), r(B, T, 2) * 4, r(B, T, 2)),
            {"A_log": r(2), "dt_bias": r(2), "state": r(B, 2, 4, 3), "beta_scale": 2.0},
        ),
        "conv_silu_l2norm": ((r(B, T, 8), r(8, 1, 4), None, r(B, 8, 3), 4), {}),
        "conv_silu": ((r(B, T, 8), r(8, 1, 4), r(8), None), {}),
        "gated_norm_proj": (
            (r(B, T, 2, 4), r(B, T, 2, 4), r(4), r(6, 8), r(6)),
            {"eps": 1e-5, "act": "silu", "group": 4, "n_flat": 2},
        ),
        "swiglu": ((r(B, T, 8), r(B, T, 8)), {}),
        "dsa_w_scale": (
            (r(B, T, 2, 4), r(B, T, 1, 4), r(B, T, 1, 4), r(B, T, 2, 8), r(B, T, 8)),
            {"w_idx": r(B, T, 2), "c": 0.5},
        ),
        "rope_cache": (
            (r(B, 1, 3, 6), r(B, 1, 1, 6), r(B, 1, 1, 6), r(B, 4), r(B, 4), r(B, 1, 5, 6), r(B, 1, 5, 6)),
            {"positions": torch.tensor([3, 1]), "norm": (r(6), r(6), 1e-6)},
        ),
    }[rule]


@pytest.mark.parametrize("rule", list(RULES))
def test_pattern_and_replacement_agree(rule):
    args, kw = _inputs(rule, torch.Generator().manual_seed(0))
    want = RULES[rule].pattern(*args, **kw)
    got = RULES[rule].replacement(*args, **kw)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for w, o in zip(want, got, strict=True):
        torch.testing.assert_close(o, w, rtol=1e-12, atol=1e-12)
