"""GPU benchmark of the delta-rule family (GDN, DeltaNet, KDA), side by side with the peer (fla).

`cases()` returns harness Cases (bench/kernels.py merges them); `python bench/kernels_delta.py`
runs them standalone, prints a table with ratios to the peer and writes `$OUT/kernels_delta.json`.
Selection: `ONLY=substring,substring` keeps the cases whose group contains one of the substrings,
`IMPLS=name,name` those rows only (e.g. `IMPLS=lt2dsl,lt2dsl-tall,fla`);
`TAG=name` writes `$OUT/kernels_delta_<name>.json` instead.

Shapes: training at B·T = 32k tokens, H = 16, D = 128, bf16, T ∈ {2k, 8k, 32k} (B = 16, 4, 1;
B = 4, T = 8192 is the peer's reading in /work/shared/bench/README.md), forward and
forward+backward; one decode step (T = 1) at batch 1, 8, 64, state updated in place (ours) or
returned (the peer's fused_recurrent). At T = 8192, `lt2dsl-wu` is the forward with W and U formed
per chunk first (the peer's two-dot scan, LT2_DELTA_WU) instead of the scan applying T itself,
and `lt2dsl-scanbwd` (forward+backward) the fused reverse-scan backward (LT2_DELTA_WBWD=0)
instead of the default W-based one (VARIANTS=0 leaves both out); GRADBK=1 adds the backward at
the gradient kernel's other key tiles (`lt2dsl-gk32`, `-gk64`, `-gk128`); BWD16=1 adds
`lt2dsl-bwd16`, the reverse scan on 16-bit operands (LT2_DELTA_BWD16); SCRATCH=1 adds the
backward with its scratch in 16 bits (`lt2dsl-lp1`, LT2_DELTA_BWD_LP=1), with the C x C matrices
in 16 bits too (`-lp2`), each with Y formed in the reverse scan (`-lp1yscan`, `-lp2yscan`,
LT2_DELTA_Y_IN_SCAN=1), and the 16-bit scratch with Y in the C x C kernel (`-lp1ycc`) or the
gradient kernel's 128-wide key tile (`-lp1gk128`), with Pᵀ dO formed in the reverse scan
(`-lp1du0`, LT2_DELTA_DU0_IN_SCAN=1) and with Y there too (`-lp1du0yscan`); BF16DOTS=1 adds
`lt2dsl-bf16dots`, GDN with every dot on 16-bit operands
(LT2_DELTA_BF16_DOTS: faster, ~1% instead of ~0.5% relative RMS against float64). The default
forms the output in the state scan with the state transposed, for training too; FUSEDO=1 adds,
for GDN and DeltaNet at T = 8192 and 32768, `lt2dsl-splito` (scan and output apart, LT2_DELTA_FUSED_O=0),
`lt2dsl-infonly` (fused for inference only, =inference: training splits), for DeltaNet
`lt2dsl-gate1` (its scan as the scalar-gate code with b = 0, LT2_DELTA_NOGATE=0), `lt2dsl-fusedo` (the
scan untransposed, LT2_DELTA_TSTATE=0), `lt2dsl-twu` (W and U formed first, LT2_DELTA_WU=1) and,
forward+backward, `lt2dsl-tbwd` (the reverse scan with the state gradient transposed,
LT2_DELTA_TSTATE_BWD=1), `lt2dsl-ycc` (Y = Tᵀ dU' formed by the C x C kernel,
LT2_DELTA_Y_IN_CC=1) and `lt2dsl-tall` (all three).
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


def _train_cases(op: str, B: int, T: int) -> list[Case]:
    group = f"{op} B={B} T={T}"
    out = []
    for backward in (False, True):
        extra = dict(flops=_flops(B, T, backward), bytes=_bytes(op, B, T, backward), backward=backward)

        def ours(op=op, backward=backward):
            x = _inputs(op, B, T, backward)
            return (lambda: _ours(op, x)[0]), _leaves(x)

        if op == "kda":
            # KDA's launch switches are env vars read at each call: every case sets all of them
            # (the backward the harness runs next sees the same), so variants share one process
            variants = _KDA_VARIANTS if T == 8192 and os.environ.get("KDA_VARIANTS", "1") != "0" else {}
            for suffix, env in {"": {}, **variants}.items():
                out.append(Case(group=group, impl="lt2dsl" + suffix, make=_env(_flags(ours), env), **extra))
        else:
            out.append(Case(group=group, impl="lt2dsl", make=_flags(ours), **extra))
        if T == 8192 and op != "kda" and os.environ.get("VARIANTS", "1") != "0":
            out.append(Case(group=group, impl="lt2dsl-wu", make=_flags(ours, WU=True), **extra))
            if backward:  # the fused reverse-scan backward (LT2_DELTA_WBWD=0)
                out.append(Case(group=group, impl="lt2dsl-scanbwd", make=_flags(ours, WBWD=False), **extra))
        if op != "kda" and T >= 8192 and os.environ.get("FUSEDO") == "1":  # other forms of the forward scan
            out.append(Case(group=group, impl="lt2dsl-splito", make=_flags(ours, FUSED_O=False), **extra))
            untransposed = _flags(ours, TSTATE=False)
            out.append(Case(group=group, impl="lt2dsl-fusedo", make=untransposed, **extra))
            out.append(Case(group=group, impl="lt2dsl-infonly", make=_flags(ours, FUSED_O=None), **extra))
            out.append(Case(group=group, impl="lt2dsl-twu", make=_flags(ours, WU=True), **extra))
            if op == "deltanet":  # the scan as the scalar-gate code with b = 0 (LT2_DELTA_NOGATE=0)
                out.append(Case(group=group, impl="lt2dsl-gate1", make=_flags(ours, NOGATE=False), **extra))
            if backward:  # the reverse scan with the state gradient transposed (LT2_DELTA_TSTATE_BWD=1)
                tbwd = _flags(ours, TSTATE_BWD=True)
                out.append(Case(group=group, impl="lt2dsl-tbwd", make=tbwd, **extra))
                # Y = Tᵀ dU' formed by the C x C kernel (LT2_DELTA_Y_IN_CC=1), alone and with the above
                out.append(Case(group=group, impl="lt2dsl-ycc", make=_flags(ours, Y_IN_CC=True), **extra))
                every = _flags(ours, TSTATE_BWD=True, Y_IN_CC=True)
                out.append(Case(group=group, impl="lt2dsl-tall", make=every, **extra))
        if backward and op != "kda" and T == 8192 and os.environ.get("GRADBK") == "1":
            # the per-(K tile, chunk) gradient kernel's other key tiles (LT2_DELTA_GRAD_BK)
            import lt2dsl.kernels.delta.launch as launch

            for bk in (32, 64, 128):
                if bk != launch.GRAD_BK:
                    tiles = _flags(ours, GRAD_BK=bk)
                    out.append(Case(group=group, impl=f"lt2dsl-gk{bk}", make=tiles, **extra))
        if backward and op != "kda" and T == 8192 and os.environ.get("BWD16") == "1":
            # the reverse scan on 16-bit operands (LT2_DELTA_BWD16=1)
            out.append(Case(group=group, impl="lt2dsl-bwd16", make=_flags(ours, BWD16="1"), **extra))
        if backward and op != "kda" and T == 8192 and os.environ.get("SCRATCH") == "1":
            # the backward's scratch in 16 bits (LT2_DELTA_BWD_LP=1), its C x C matrices too (=2),
            # each with Y = Tᵀ dU' formed in the reverse scan (LT2_DELTA_Y_IN_SCAN=1), and the
            # 16-bit scratch with Y in the C x C kernel (Y_IN_CC) or the 128-wide gradient tile
            for impl, flags in (
                ("lt2dsl-lp1", dict(BWD_LP=1)),
                ("lt2dsl-lp2", dict(BWD_LP=2)),
                ("lt2dsl-lp1yscan", dict(BWD_LP=1, Y_IN_SCAN=True)),
                ("lt2dsl-lp2yscan", dict(BWD_LP=2, Y_IN_SCAN=True)),
                ("lt2dsl-lp1ycc", dict(BWD_LP=1, Y_IN_CC=True)),
                ("lt2dsl-lp1gk128", dict(BWD_LP=1, GRAD_BK=128)),
                # Pᵀ dO formed in the reverse scan (LT2_DELTA_DU0_IN_SCAN=1), alone and with Y
                ("lt2dsl-lp1du0", dict(BWD_LP=1, DU0_IN_SCAN=True)),
                ("lt2dsl-lp1du0yscan", dict(BWD_LP=1, DU0_IN_SCAN=True, Y_IN_SCAN=True)),
            ):
                out.append(Case(group=group, impl=impl, make=_flags(ours, **flags), **extra))
        if op == "gdn" and T == 8192 and os.environ.get("BF16DOTS") == "1":
            out.append(Case(group=group, impl="lt2dsl-bf16dots", make=_flags(ours, BF16_DOTS=True), **extra))
        peer = _peer_chunk(op)
        if peer is not None:

            def theirs(op=op, backward=backward, peer=peer):
                x = _inputs(op, B, T, backward)
                return (lambda: peer(x)[0]), _leaves(x)

            out.append(Case(group=group, impl="fla", make=theirs, **extra))
    return out


_KDA_TOGGLES = ("LT2_KDA_SPLIT", "LT2_KDA_GRAD", "LT2_KDA_GRAD_SPLIT")
# impl suffix -> switches (the rest at their defaults); KDA_VARIANTS=0 times none of them
# (the gradient tiles 32 x 8 warps and 64 x 8 lost to the default 32 x 4 in the thirteenth
# session: 12.818 and 9.914 against 9.440 ms fwd+bwd)
_KDA_VARIANTS = {"-onekernel": {"LT2_KDA_SPLIT": "0"}, "-gradsplit": {"LT2_KDA_GRAD_SPLIT": "1"}}


def _env(make, env: dict):
    """Wrap a case so each call first sets the KDA switches to `env` (unset ones removed)."""

    def wrapped():
        fn, leaves = make()

        def call():
            for name in _KDA_TOGGLES:
                if name in env:
                    os.environ[name] = env[name]
                else:
                    os.environ.pop(name, None)
            return fn()

        return call, leaves

    return wrapped


# `delta_launch` switches a case may set; each case sets all of them (the ones it names, the rest
# at their import-time values) when it runs and leaves them so: the harness runs the backward after
# the call returns, and the reverse scan's switches (WBWD, TSTATE_BWD) are read then.
_SWITCHES = (
    "WU", "WBWD", "FUSED_O", "TSTATE", "TSTATE_BWD", "Y_IN_CC", "BF16_DOTS", "NOGATE", "GRAD_BK", "BWD16",
    "BWD_LP", "Y_IN_SCAN", "DU0_IN_SCAN",
)  # fmt: skip
_DEFAULTS: dict = {}


def _restore_switches() -> None:
    """Every `delta_launch` switch back at its import-time value (cases leave theirs set)."""
    import lt2dsl.kernels.delta.launch as launch

    for k, v in _DEFAULTS.items():
        setattr(launch, k, v)


def _flags(make, **flags):
    """Wrap a case so every call, and the backward after it, runs with these `delta_launch`
    switches (e.g. BF16_DOTS=True: 16-bit dot operands throughout; WU=True: W and U per chunk
    first) and the others at their defaults."""
    import lt2dsl.kernels.delta.launch as launch

    if not _DEFAULTS:
        _DEFAULTS.update({k: getattr(launch, k) for k in _SWITCHES if hasattr(launch, k)})
    unknown = set(flags) - set(_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown delta_launch switches {sorted(unknown)}; known: {sorted(_DEFAULTS)}")

    def wrapped():
        fn, leaves = make()

        def call():
            for k, v in {**_DEFAULTS, **flags}.items():
                setattr(launch, k, v)
            return fn()

        return call, leaves

    return wrapped


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
    # within each (shape, mode) the default and the peer run before the variants, so a stage cut by
    # its time limit still has the same-run pair (the twentieth session lost DeltaNet's peer row so)
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
    _restore_switches()
    if os.environ.get("AGREE", "1") != "0":  # AGREE=0: skip it (the peer's GDN and DeltaNet autotune)
        peer_agreement()
    print(summary_table(rows))


if __name__ == "__main__":
    main()
