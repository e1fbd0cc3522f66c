"""GPU benchmark of the delta-rule family (GDN, DeltaNet, KDA), side by side with the peer (fla).

`cases()` returns harness Cases (bench/kernel_times.py merges them); `python bench/kernels_delta.py`
runs them standalone, prints a table with ratios to the peer and writes `$OUT/kernels_delta.json`.
Selection: `ONLY=substring,substring` keeps the cases whose group contains one of the substrings,
`IMPLS=name,name` those rows only (e.g. `IMPLS=lt2dsl,lt2dsl-split,fla`);
`TAG=name` writes `$OUT/kernels_delta_<name>.json` instead.

Shapes: training at B·T = 32k tokens, H = 16, D = 128, bf16, T ∈ {2k, 8k, 32k} (B = 16, 4, 1;
B = 4, T = 8192 is the peer's reading in /work/shared/bench/README.md), forward and
forward+backward; one decode step (T = 1) at batch 1, 8, 64, state updated in place (ours) or
returned (the peer's fused_recurrent). The `lt2dsl` row runs each call's default recipe
(`lt2dsl/kernels/delta/recipe.py`); `RECIPES=split,fused` adds a row `lt2dsl-<name>` per named
recipe of `recipe.RECIPES`, for the rules that have its forms (KDA has no fused scan).
The standalone run also prints how far our forward output is from the peer's on the same inputs.

FLOPs are the useful work of mixers.md §4 (d) (the backward counted by our formula); bytes are the
minimum traffic: inputs read and outputs written once (decode: the fp32 state read and written).
SMOKE=1 runs every case once on tiny CPU shapes under the Triton interpreter (no timing).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SMOKE = os.environ.get("SMOKE") == "1"
if SMOKE:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from bench.harness import Case, measure_ceilings, run_cases, summary_table  # noqa: E402

DEV, DT = ("cpu", torch.float32) if SMOKE else ("cuda", torch.bfloat16)
H, D = (2, 32) if SMOKE else (16, 128)
TRAIN_SHAPES = [(1, 100)] if SMOKE else [(16, 2048), (4, 8192), (1, 32768)]
DECODE_BATCHES = [1, 8] if SMOKE else [1, 8, 64]
OPS = ("gdn", "deltanet", "kda")


def _inputs(op: str, B: int, T: int, grad: bool) -> dict:
    """The peer's benchmark inputs (peer_anchors.py): unit-norm q, k; β ∈ (0, 1); log decays."""

    def rnd(*s):
        return torch.randn(*s, device=DEV, dtype=torch.float32)

    x = {
        "q": F.normalize(rnd(B, T, H, D), dim=-1).to(DT),
        "k": F.normalize(rnd(B, T, H, D), dim=-1).to(DT),
        "v": rnd(B, T, H, D).to(DT),
        "beta": torch.rand(B, T, H, device=DEV, dtype=torch.float32).to(DT),
        "g": None,
    }
    if op == "gdn":
        x["g"] = F.logsigmoid(rnd(B, T, H))
    elif op == "kda":
        x["g"] = F.logsigmoid(rnd(B, T, H, D)) / 16
    return {n: (t.requires_grad_(grad) if t is not None else None) for n, t in x.items()}


def _leaves(x: dict) -> list[torch.Tensor]:
    return [t for t in x.values() if t is not None and t.requires_grad]


def _ours(op: str, x: dict, **kw):
    from lt2dsl.kernels import delta_rule, gated_delta_rule, kda

    if op == "deltanet":
        return delta_rule(x["q"], x["k"], x["v"], x["beta"], backend="triton", **kw)
    fn = gated_delta_rule if op == "gdn" else kda
    return fn(x["q"], x["k"], x["v"], x["g"], x["beta"], backend="triton", **kw)


def _peer_chunk(op: str):
    """The peer's chunked op, or None when fla is not importable (or NO_PEER=1: a quick A/B of our
    variants; the figures for the record come from runs with the peer)."""
    if os.environ.get("NO_PEER") == "1":
        return None
    try:
        if op == "gdn":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as f

            return lambda x: f(x["q"], x["k"], x["v"], x["g"], x["beta"])
        if op == "deltanet":
            from fla.ops.delta_rule import chunk_delta_rule as f

            return lambda x: f(x["q"], x["k"], x["v"], x["beta"])
        from fla.ops.kda import chunk_kda as f

        return lambda x: f(x["q"], x["k"], x["v"], x["g"], x["beta"])
    except ImportError:
        return None


def _peer_recurrent(op: str):
    try:
        if op == "gdn":
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as f

            return lambda x, s: f(
                x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], initial_state=s, output_final_state=True
            )
        if op == "deltanet":
            from fla.ops.delta_rule import fused_recurrent_delta_rule as f

            return lambda x, s: f(
                x["q"], x["k"], x["v"], beta=x["beta"], initial_state=s, output_final_state=True
            )
        from fla.ops.kda import fused_recurrent_kda as f

        return lambda x, s: f(
            x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], initial_state=s, output_final_state=True
        )
    except ImportError:
        return None


def _flops(B: int, T: int, backward: bool) -> float:
    from lt2dsl.kernels.delta.ops import chunk_bwd_flops, chunk_flops

    f = chunk_flops(B, T, H, D, D)
    return f + chunk_bwd_flops(B, T, H, D, D) if backward else f


def _bytes(op: str, B: int, T: int, backward: bool) -> float:
    """q, k, v, β, g read and o written once (bf16; g fp32); the backward adds dO read and
    dq, dk, dv, dβ, dg written, plus q, k, v, β, g read again."""
    tok = B * T * H
    g = {"gdn": 4, "deltanet": 0, "kda": 4 * D}[op]
    fwd = tok * (4 * D * 2 + 2 + g)
    return fwd * 3 if backward else fwd


def _recipes(op: str) -> list[str]:
    """The named recipes `RECIPES` asks for that `op` has the forms of."""
    from lt2dsl.kernels.delta.recipe import RECIPES

    names = [n for n in os.environ.get("RECIPES", "").split(",") if n]
    unknown = set(names) - set(RECIPES)
    if unknown:
        raise ValueError(f"unknown delta recipes {sorted(unknown)}; known: {', '.join(RECIPES)}")
    return [n for n in names if n != "default" and not (op == "kda" and n == "fused")]


def _train_cases(op: str, B: int, T: int) -> list[Case]:
    group = f"{op} B={B} T={T}"
    out = []
    for backward in (False, True):
        extra = dict(flops=_flops(B, T, backward), bytes=_bytes(op, B, T, backward), backward=backward)
        for recipe in [None, *_recipes(op)]:

            def ours(op=op, backward=backward, recipe=recipe):
                x = _inputs(op, B, T, backward)
                return (lambda: _ours(op, x, recipe=recipe)[0]), _leaves(x)

            impl = "lt2dsl" if recipe is None else f"lt2dsl-{recipe}"
            out.append(Case(group=group, impl=impl, make=ours, **extra))
        peer = _peer_chunk(op)
        if peer is not None:

            def theirs(op=op, backward=backward, peer=peer):
                x = _inputs(op, B, T, backward)
                return (lambda: peer(x)[0]), _leaves(x)

            out.append(Case(group=group, impl="fla", make=theirs, **extra))
    return out


def _decode_cases(op: str, batch: int) -> list[Case]:
    group = f"{op} decode b={batch}"
    state_bytes = 2 * batch * H * D * D * 4
    out = []

    def ours(op=op):
        x = _inputs(op, batch, 1, False)
        S = torch.randn(batch, H, D, D, device=DEV) * 0.1
        return (lambda: _ours(op, x, initial_state=S, inplace_final_state=True)[0]), []

    out.append(Case(group=group, impl="lt2dsl", make=ours, bytes=state_bytes))
    peer = _peer_recurrent(op)
    if peer is not None:

        def theirs(op=op, peer=peer):
            x = _inputs(op, batch, 1, False)
            S = torch.randn(batch, H, D, D, device=DEV) * 0.1
            return (lambda: peer(x, S)[0]), []

        out.append(Case(group=group, impl="fla", make=theirs, bytes=state_bytes))
    return out


def cases() -> list[Case]:
    out = []
    for op in OPS:
        for B, T in TRAIN_SHAPES:
            out += _train_cases(op, B, T)
        for batch in DECODE_BATCHES:
            out += _decode_cases(op, batch)
    only = [s for s in os.environ.get("ONLY", "").split(",") if s]
    impls = [s for s in os.environ.get("IMPLS", "").split(",") if s]
    out = [c for c in out if (not only or any(s in c.group for s in only)) and (not impls or c.impl in impls)]
    # within each (shape, mode) the default and the peer run before the other recipes, so a stage
    # cut by its time limit still has the same-run pair
    first: dict = {}
    for c in out:
        first.setdefault((c.group, c.backward), len(first))
    rank = {"lt2dsl": 0, "fla": 1}
    return sorted(out, key=lambda c: (first[(c.group, c.backward)], rank.get(c.impl, 2)))


def peer_agreement() -> None:
    """Relative RMS between our forward output and the peer's on the B=4, T=8192 inputs."""
    for op in OPS:
        peer = _peer_chunk(op)
        if peer is None:
            continue
        with torch.no_grad():
            x = _inputs(op, 4, 8192, False)
            a, b = _ours(op, x)[0].float(), peer(x)[0].float()
        print(f"{op}: ours vs fla forward, relative RMS {((a - b).norm() / b.norm()).item():.2e}")


def _smoke(all_cases: list[Case]) -> None:
    for c in all_cases:
        fn, leaves = c.make()
        out = fn()
        if c.backward:
            (out[0] if isinstance(out, tuple) else out).float().sum().backward()
        print(f"{c.group:28s} {c.impl:16s} {'fwd+bwd' if c.backward else 'fwd':8s} ok", flush=True)


def main() -> None:
    all_cases = cases()
    if SMOKE:
        _smoke(all_cases)
        return
    ceil = measure_ceilings()
    print(f"ceilings: copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul {ceil['bf16_TFLOPs']:.0f} TFLOP/s")
    tag = os.environ.get("TAG")
    rows = run_cases("kernels_delta" + (f"_{tag}" if tag else ""), all_cases, ceil)
    if os.environ.get("AGREE", "1") != "0":  # AGREE=0: skip it (the peer's GDN and DeltaNet autotune)
        peer_agreement()
    print(summary_table(rows))


if __name__ == "__main__":
    main()
