"""Helpers of the fusion-pass tests: fused copies of lowered graphs and the four checks.

The four checks of a fusion (style.md R11, after Inductor's `test_fused_attention.py`): the rule
fired (its counter), the emitted code has the fused op and not the unfused pair, the outputs equal
the unfused graph's, and so do the gradients of every parameter.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
import torch.fx

from lt2dsl.kernels.fused.testing import assert_close
from lt2dsl.lowering.fx_passes import COUNTERS, fuse
from lt2dsl.lowering.to_fx import LoweringTracer

from ..util import lower, tokens

Absent = str | Callable[[torch.fx.GraphModule], bool]


def fused_copy(gm: torch.fx.GraphModule, rules: Sequence[str] | None = None) -> torch.fx.GraphModule:
    """A copy of `gm` sharing its modules and parameters, fused with `rules`."""
    out = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
    fuse(out, rules=rules)
    return out


def trace(module: torch.nn.Module) -> torch.fx.GraphModule:
    """A hand-built module traced as the lowering traces (leaves kept, norms as modules)."""
    return torch.fx.GraphModule(module, LoweringTracer().trace(module))


def outputs_and_grads(gm, params: list[torch.nn.Parameter], *args, seed: int = 3):
    """(output, d⟨output, w⟩/d params) for a fixed random w; unused parameters get zeros."""
    out = gm(*args)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype).to(out.device)
    grads = torch.autograd.grad((out * w).sum(), params, allow_unused=True)
    return out.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def assert_same(gm, fgm, params, *args, tol: float = 1e-10, rms: bool = False) -> None:
    """Checks 3 and 4: forward outputs and parameter gradients of the two graphs agree
    (elementwise, or by relative RMS error with `rms`, for kernels in low precision)."""
    out, grads = outputs_and_grads(gm, params, *args)
    fout, fgrads = outputs_and_grads(fgm, params, *args)
    if rms:
        assert_close("output", fout, out, tol)
        for i, (g, fg) in enumerate(zip(grads, fgrads)):
            assert_close(f"grad of param {i}", fg, g, tol)
        return
    torch.testing.assert_close(fout, out, rtol=tol, atol=tol)
    for i, (g, fg) in enumerate(zip(grads, fgrads)):
        torch.testing.assert_close(fg, g, rtol=tol, atol=tol, msg=lambda m, i=i: f"grad of param {i}: {m}")


def check_fusion(
    body: str, rule: str, fused_op: str, absent: Sequence[Absent], *, B: int = 2, T: int = 9, **settings
) -> torch.fx.GraphModule:
    """The four checks for `rule` on the tiny float64 model of `body`; returns the fused graph."""
    model = lower(body, **settings)
    gm = model.graph_module
    fgm = fused_copy(gm, [rule])
    assert COUNTERS[rule] >= 1, f"{rule} did not fire on `{body}`"
    code = fgm.code
    assert fused_op in code, f"{fused_op} missing from the fused code"
    for a in absent:
        present = a(fgm) if callable(a) else a in code
        assert not present, f"unfused {a} left in the code of `{body}`"
    assert_same(gm, fgm, list(model.parameters()), tokens(B, T, vocab=model.config.vocab))
    return fgm


def check_unchanged(gm: torch.fx.GraphModule, rule: str) -> None:
    """A rule that finds no pattern leaves the graph exactly as it was."""
    before = gm.code
    result = fuse(gm, rules=[rule])
    assert COUNTERS[rule] == 0 and not result.modified
    assert gm.code == before


def assert_rule_changes_nothing_off_its_step(base, ruled, ids: torch.Tensor) -> None:
    """An opt-in decode rule's model (`ruled`) against the same model without it (`base`), both
    float64 on the reference backend: outputs and every parameter's gradient of a forward over
    `ids` equal, and so does a one-token step after a prompt of all but the last token through a
    dynamic cache (the leaf's fallback runs the nodes it replaced, in their order)."""
    out, grads = outputs_and_grads(base.graph_module, list(base.parameters()), ids)
    rout, rgrads = outputs_and_grads(ruled.graph_module, list(ruled.parameters()), ids)
    torch.testing.assert_close(rout, out, rtol=1e-12, atol=1e-12)
    for g, rg in zip(grads, rgrads, strict=True):
        torch.testing.assert_close(rg, g, rtol=1e-12, atol=1e-12)
    n = ids.shape[1] - 1
    with torch.no_grad():
        c1, c2 = base.new_cache(ids.shape[0]), ruled.new_cache(ids.shape[0])
        base(ids[:, :n], c1)
        ruled(ids[:, :n], c2)
        torch.testing.assert_close(ruled(ids[:, n:], c2), base(ids[:, n:], c1), rtol=1e-12, atol=1e-12)
