"""FX fusion pass over the lowered graph: adjacent operations fused into single kernels by rules.

`fuse(gm, rules=None, opt_in=())` runs the rules of `RULES` (all, or the named ones, in `RULES`
order) and the named rules of `OPT_IN` after them on a lowered `torch.fx.GraphModule` in place and
returns `PassResult(gm, modified)`; `COUNTERS` maps each rule name to how often it fired in the
last run. `LT2_DEBUG=1` prints the rules that fired with their counts, `LT2_DEBUG=2` also the graph
code before and after.

| rule | pattern → replacement |
|---|---|
| `gdn_gate` | −exp(A_log)·softplus(a + dt_bias), σ(b) [·2] → `gdn_gate(a, b, A_log, dt_bias)` |
| `gdn_gate_core` | GDN core(…, gdn_gate(a, b, …)) → one node, the gates formed in the decode kernel |
| `conv_silu_l2norm` | q, k (, v) short convs + SiLU, the core's q/k L2Norm → one node, one decode launch |
| `conv_silu` | short conv + SiLU → one conv kernel |
| `gated_norm_proj` | GatedRMSNorm(o, g) → flatten → o_proj → `gated_rmsnorm_linear` |
| `swiglu` | silu(a) · b → `swiglu(a, b)` |
| `norm_add_rmsnorm` | x + RMSNorm(y) → RMSNorm (sandwich) → `norm_add_rmsnorm(x, y)` = (normed, sum) |
| `add_rmsnorm` | x + r → RMSNorm → `add_rmsnorm(x, r)` = (normed, sum) |
| `norm_proj` | norm → several projections → one concatenated GEMM (`linear_split`) |
| `rope_cache` | RoPE of q, [LayerNorm'd] k → k (, v) appended to the cache → one node, one decode launch |
| `dsa_w_scale` | dsa_attend(…, w · c) → dsa_attend(…, w, w_scale=c): the indexer scales w in its kernel |

Opt-in rules (`OPT_IN`, run after those only when named in `opt_in`; none faster on the H100, s32 and s34):

| rule | pattern → replacement |
|---|---|
| `gdn_decode` | GDN convs → gated recurrence → gated norm · W_o → one node: two launches and W_o at decode |
| `gdn_block` | (with `gdn_decode`) a GDN block's in-projection … down projection → one persistent launch |
| `decode_gemv` | proj → (norm_)add_rmsnorm → linear_split [→ swiglu] → one node: two GEMVs at decode |
| `l2_prefetch` | after each projection, the next one's weight prefetched into L2 on a side stream (decode) |

The rules live one per file (a group for the two conv rules); `manager.py` holds the matcher
contract and the pass; `leaves.py` the cache-aware functions the fused graph calls.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import torch.fx
from torch.fx.passes.infra.pass_base import PassResult

from lt2dsl.env import debug_level

from . import (
    add_norm,
    conv,
    decode_gemv,
    dsa_scale,
    gates,
    gdn_block,
    gdn_step,
    out_norm,
    prefetch,
    projections,
    rope_cache,
    swiglu,
)
from .manager import FuseAdjacent, Rule

__all__ = ["COUNTERS", "OPT_IN", "RULES", "FuseAdjacent", "Rule", "fuse", "fuse_graph", "opt_in_names"]

RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        gates.RULE,
        conv.RULE_L2,
        conv.RULE,
        gates.RULE_CORE,
        out_norm.RULE,
        swiglu.RULE,
        add_norm.RULE_PRE,
        add_norm.RULE,
        projections.RULE,
        rope_cache.RULE,
        dsa_scale.RULE,
    )
}

# Rules off by default, run after `RULES` when named in `opt_in`, in this order (`gdn_block` and
# `decode_gemv` fold what `gdn_decode` leaves, `l2_prefetch` sees their nodes): decode-only
# rewrites that the H100 did not run faster (docs/decode.md).
OPT_IN: dict[str, Rule] = {
    r.name: r for r in (gdn_step.RULE, gdn_block.RULE, decode_gemv.RULE, prefetch.RULE)
}

# rule name -> how many times it fired in the last `fuse` call
COUNTERS: dict[str, int] = dict.fromkeys([*RULES, *OPT_IN], 0)


def select(rules: Sequence[str] | None, opt_in: Sequence[str] = ()) -> list[Rule]:
    """The named rules and the rules they need (`Rule.needs`) in `RULES` order (all for None), then
    the `opt_in` rules in `OPT_IN` order; unknown names raise ValueError."""
    if rules is None:
        rules = list(RULES)
    if isinstance(rules, str):
        rules = [rules]
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        raise ValueError(f"unknown fusion rule(s) {', '.join(map(repr, unknown))}; rules: {', '.join(RULES)}")
    extra = opt_in_names(opt_in)
    wanted = set(rules) | {n for r in rules for n in RULES[r].needs}
    chosen = [r for name, r in RULES.items() if name in wanted]
    return chosen + [r for name, r in OPT_IN.items() if name in extra]


def opt_in_names(opt_in: Sequence[str]) -> tuple[str, ...]:
    """`opt_in` checked against `OPT_IN` (a ValueError names an unknown one) with the opt-in rules
    they need (`Rule.needs`), in `OPT_IN` order."""
    if isinstance(opt_in, str):
        opt_in = [opt_in]
    unknown = [r for r in opt_in if r not in OPT_IN]
    if unknown:
        names = ", ".join(map(repr, unknown))
        raise ValueError(f"unknown opt-in fusion rule(s) {names}; opt-in rules: {', '.join(OPT_IN)}")
    wanted = set(opt_in) | {n for r in opt_in for n in OPT_IN[r].needs}
    return tuple(name for name in OPT_IN if name in wanted)


def fuse(
    gm: torch.fx.GraphModule, *, rules: Sequence[str] | None = None, opt_in: Sequence[str] = ()
) -> PassResult:
    """Fuse adjacent operations of a lowered GraphModule in place.

    Args:
        gm (torch.fx.GraphModule): a lowered graph (`LT2Model.graph_module` or a copy sharing its
            modules); rewritten in place, parameters shared.
        rules (Sequence[str], Optional): names from `RULES` to run. Default: all.
        opt_in (Sequence[str], Optional): names from `OPT_IN` to run after them. Default: none.
    Returns:
        PassResult: (gm, modified). `COUNTERS` holds this run's fire count per rule.
    """
    chosen = select(rules, opt_in)
    level = debug_level()
    if level >= 2:
        print(f"lt2dsl: graph before `fuse-adjacent`:\n{gm.code}", file=sys.stderr)
    t0 = time.perf_counter()
    fuse_pass = FuseAdjacent(chosen)
    result = fuse_pass(gm)
    COUNTERS.clear()
    COUNTERS.update(dict.fromkeys([*RULES, *OPT_IN], 0))
    COUNTERS.update(fuse_pass.counts)
    if level >= 1:
        ms = 1000 * (time.perf_counter() - t0)
        fired = ", ".join(f"{k} ×{v}" for k, v in fuse_pass.counts.items() if v) or "none"
        print(f"lt2dsl: pass `fuse-adjacent` {ms:.2f} ms; rules fired: {fired}", file=sys.stderr)
    if level >= 2:
        print(f"lt2dsl: graph after `fuse-adjacent`:\n{gm.code}", file=sys.stderr)
    return result


def fuse_graph(gm: torch.fx.GraphModule, opt_in: Sequence[str] = ()) -> torch.fx.GraphModule:
    """`fuse` with every rule of `RULES` and the `opt_in` ones, as a GraphModule → GraphModule step
    for `LT2Model.graph_passes` (a named function, not a lambda, so a fused model still pickles;
    `functools.partial(fuse_graph, opt_in=...)` for opt-in rules)."""
    return fuse(gm, opt_in=opt_in).graph_module
