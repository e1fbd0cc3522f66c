"""GPU benchmark of the decay family and the Toeplitz mixer, side by side with the peer (fla).

`cases()` returns harness Cases (bench/kernel_times.py can merge them); `python bench/kernels_decay.py`
runs them standalone, prints a table with ratios to the peer and writes `$OUT/kernels_decay.json`.
Selection: `ONLY=substring,substring` keeps the cases whose group contains one of the substrings;
`TAG=name` writes `$OUT/kernels_decay_<name>.json` instead, so split runs do not overwrite each other.

Shapes: training at B·T = 32k tokens, H = 16, D = 128, bf16, for T ∈ {2k, 8k, 32k} (B = 16, 4, 1;
B = 4, T = 8192 is the peer's reading in /work/shared/bench/README.md); one decode step at batch
1, 8, 64 with the state updated in place; the Toeplitz mixer at T = 32k against the dense masked
product (matrix built outside the timing) and against a plain torch.fft round trip of the same data.
"""

from __future__ import annotations

import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import Case, measure_ceilings, run_cases, summary_table

# SMOKE=1: tiny shapes on the CPU (Triton interpreter), every case built and run once, no timing;
# checks that the script's code paths work where no GPU is available
SMOKE = os.environ.get("SMOKE") == "1"
DEV, DT = ("cpu", torch.float32) if SMOKE else ("cuda", torch.bfloat16)
H, D = (2, 32) if SMOKE else (16, 128)
TRAIN_SHAPES = [(1, 100)] if SMOKE else [(16, 2048), (4, 8192), (1, 32768)]
DECODE_BATCHES = [1, 8] if SMOKE else [1, 8, 64]
TOEPLITZ = dict(T=200, B=1, C=16) if SMOKE else dict(T=32768, B=1, C=1024)
# the Toeplitz cases run in bf16 under SMOKE too: the blocked path takes 16-bit inputs only
TDT = torch.bfloat16


def _rnd(*shape, scale=1.0, dtype=DT):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


def _leaf(x):
    return x.detach().requires_grad_(True)


def _chunk_flops(B, T, extra=0):
    """mixers.md summary table, forward: (2C(K + V) + 4KV + extra) per token and head, C = 64."""
    return B * T * H * (2 * 64 * (D + D) + 4 * D * D + extra)


def _inputs(B, T, gate):
    q, k, v = (_leaf(_rnd(B, T, H, D)) for _ in range(3))
    if gate == "gla":
        g = _leaf(F.logsigmoid(torch.randn(B, T, H, D, device=DEV)) / 16)
    elif gate == "scalar":
        g = _leaf(F.logsigmoid(torch.randn(B, T, H, device=DEV)))
    elif gate == "retnet":
        g = (
            (1 - 2.0 ** (-5 - torch.arange(H, device=DEV, dtype=torch.float32)))
            .log()
            .expand(B, T, H)
            .contiguous()
        )
    else:
        g = None
    return q, k, v, g


def _ours(op, B, T, gate):
    from lt2dsl.kernels import gla, mlstm, simple_gla

    def make():
        q, k, v, g = _inputs(B, T, gate)
        if op == "mlstm":
            i = _leaf(torch.randn(B, T, H, device=DEV))
            f = _leaf(torch.randn(B, T, H, device=DEV) + 4)
            return (lambda: mlstm(q, k, v, i, f, backend="triton")[0]), [q, k, v, i, f]
        fn = gla if op == "gla" else simple_gla
        leaves = [x for x in (q, k, v, g) if x is not None and x.requires_grad]
        return (lambda: fn(q, k, v, g, backend="triton")[0]), leaves

    return make


def _peer(op, B, T, gate):
    def make():
        from fla.ops.gla import chunk_gla
        from fla.ops.linear_attn import chunk_linear_attn
        from fla.ops.retention import chunk_retention
        from fla.ops.simple_gla import chunk_simple_gla

        q, k, v, g = _inputs(B, T, gate)
        if op == "gla":
            return (lambda: chunk_gla(q, k, v, g)[0]), [q, k, v, g]
        if op == "simple_gla":
            return (lambda: chunk_simple_gla(q, k, v, g)[0]), [q, k, v, g]
        if op == "retention":
            return (lambda: chunk_retention(q, k, v)[0]), [q, k, v]
        return (lambda: chunk_linear_attn(q, k, v, normalize=False)[0]), [q, k, v]

    return make


# (group name, our op, gate kind, peer op or None, extra FLOPs per token and head)
TRAIN_OPS = [
    ("gla", "gla", "gla", "gla", 3 * 16 * D),
    ("simple_gla", "simple_gla", "scalar", "simple_gla", 0),
    ("retnet", "simple_gla", "retnet", "retention", 0),
    ("linear", "simple_gla", "none", "linear_attn", 0),
    ("mlstm", "mlstm", "mlstm", None, 4 * D + 64),
]


def train_cases() -> list[Case]:
    cases = []
    for B, T in TRAIN_SHAPES:
        for name, op, gate, peer, extra in TRAIN_OPS:
            group = f"{name} B={B} T={T}"
            flops = _chunk_flops(B, T, extra)
            for bwd in (False, True):
                fl = flops * (3 if bwd else 1)
                cases.append(Case(group, "lt2dsl", _ours(op, B, T, gate), backward=bwd, flops=fl))
                if peer is not None:
                    cases.append(Case(group, "fla", _peer(peer, B, T, gate), backward=bwd, flops=fl))
    return cases


def _decode(op, Bd, impl):
    def make():
        q, k, v = (_rnd(Bd, 1, H, D) for _ in range(3))
        state = torch.randn(Bd, H, D, D, device=DEV)
        if op == "mlstm":
            from lt2dsl.kernels import mlstm

            i, f = torch.randn(Bd, 1, H, device=DEV), torch.randn(Bd, 1, H, device=DEV) + 4
            st = (state, torch.randn(Bd, H, D, device=DEV), torch.zeros(Bd, H, device=DEV))
            return (
                lambda: mlstm(q, k, v, i, f, initial_state=st, inplace_final_state=True, backend="triton")
            ), []
        g = F.logsigmoid(torch.randn(Bd, 1, H, *((D,) if op == "gla" else ()), device=DEV))
        if impl == "fla":
            from fla.ops.gla import fused_recurrent_gla
            from fla.ops.simple_gla import fused_recurrent_simple_gla

            fn = fused_recurrent_gla if op == "gla" else fused_recurrent_simple_gla
            if op == "gla":
                return (lambda: fn(q, k, v, gk=g, initial_state=state, output_final_state=True)), []
            return (lambda: fn(q, k, v, g=g, initial_state=state, output_final_state=True)), []
        from lt2dsl.kernels import gla, simple_gla

        fn = gla if op == "gla" else simple_gla
        return (lambda: fn(q, k, v, g, initial_state=state, inplace_final_state=True, backend="triton")), []

    return make


def decode_cases() -> list[Case]:
    cases = []
    for Bd in DECODE_BATCHES:
        state_bytes = 2 * Bd * H * D * D * 4  # read + write of the fp32 state
        for op in ("gla", "simple_gla", "mlstm"):
            group = f"{op} decode step b={Bd}"
            cases.append(Case(group, "lt2dsl", _decode(op, Bd, "lt2dsl"), bytes=state_bytes))
            if op != "mlstm":
                cases.append(Case(group, "fla", _decode(op, Bd, "fla"), bytes=state_bytes))
    return cases


def toeplitz_cases(T: int, B: int, C: int) -> list[Case]:
    """One kernel shared by all channels (the only variant whose dense matrix fits: T² bf16 = 2 GiB)."""
    from lt2dsl.kernels import toeplitz_mix, toeplitz_mix_step
    from lt2dsl.kernels.toeplitz import fft_size

    N = fft_size(T)
    group = f"toeplitz B={B} T={T} C={C}"
    io_bytes = 2 * B * T * C * 2  # read x, write y (bf16)

    def data():
        x = _leaf(_rnd(B, T, C, dtype=TDT))
        w = _leaf(torch.randn(T, device=DEV) / math.sqrt(T))
        b = _leaf(torch.zeros(T, device=DEV))
        return x, w, b

    def ours(method="auto"):
        x, w, b = data()
        return (lambda: toeplitz_mix(x, w, b, backend="triton", method=method)), [x, w, b]

    def ours_fft():
        return ours("fft")

    def ours_rebuilt():
        # the kernel tables (window spectra, pass-2 tiles) are cached while w is unchanged, as the
        # dense case's matrix is built outside its timing; a training step changes w, which this
        # forces: the tables are rebuilt on every call
        from lt2dsl.kernels.toeplitz import blocked

        x, w, b = data()

        def fn():
            blocked._TABLES.clear()
            return toeplitz_mix(x, w, b, backend="triton")

        return fn, [x, w, b]

    def dense():
        x, w, b = data()
        lag = (
            torch.arange(T, device=DEV, dtype=torch.int32)[:, None]
            - torch.arange(T, device=DEV, dtype=torch.int32)[None, :]
        )
        M = torch.where(lag >= 0, w.detach()[lag.clamp(min=0)], 0.0).to(TDT)  # [T, T], built once
        del lag
        bias = b.detach().to(TDT)[:, None]
        return (lambda: torch.einsum("ts,bsc->btc", M, x) + bias), [x]

    def dense_build():
        # the layer's real cost when w is trained: the masked matrix is rebuilt from w every call
        x, w, b = data()
        lag = (
            torch.arange(T, device=DEV, dtype=torch.int32)[:, None]
            - torch.arange(T, device=DEV, dtype=torch.int32)[None, :]
        )
        idx, causal = lag.clamp(min=0), lag >= 0
        bias = b.detach().to(TDT)[:, None]

        def fn():
            M = torch.where(causal, w.detach().to(TDT)[idx], 0.0)
            return torch.einsum("ts,bsc->btc", M, x) + bias

        return fn, [x]

    def fft_round_trip():
        x, _, _ = data()
        return (lambda: torch.fft.irfft(torch.fft.rfft(x.float(), n=N, dim=1), n=N, dim=1)), [x]

    flops = B * T * C * (10 * math.log2(N) + 6)
    from lt2dsl.kernels.toeplitz.blocked_ref import block_size
    from lt2dsl.kernels.toeplitz.ops import blocked_flops

    # "lt2dsl": the default for bf16 x (blocked DFTs on tensor cores); "lt2dsl fft": cuFFT in fp32
    S = block_size(T)
    fb_flops = blocked_flops((B, T, C), S) + blocked_flops((B, T, C), S, backward=True)
    cases = [
        Case(group, "lt2dsl", ours, flops=blocked_flops((B, T, C), S), bytes=io_bytes),
        Case(group, "lt2dsl, w new", ours_rebuilt, flops=blocked_flops((B, T, C), S), bytes=io_bytes),
        Case(group, "lt2dsl fft", ours_fft, flops=flops, bytes=io_bytes),
        Case(group, "dense", dense, flops=2 * T * T * B * C),
        Case(group, "dense+build", dense_build, flops=2 * T * T * B * C),
        Case(group, "torch.fft", fft_round_trip, bytes=io_bytes),
        Case(group, "lt2dsl", ours, backward=True, flops=fb_flops),
        Case(group, "lt2dsl, w new", ours_rebuilt, backward=True, flops=fb_flops),
        Case(group, "lt2dsl fft", ours_fft, backward=True, flops=3 * flops),
        Case(group, "torch.fft", fft_round_trip, backward=True),
    ]
    for Bd in (1, 8):

        def step(Bd=Bd):
            x = _rnd(Bd, T, C, dtype=TDT)
            w = torch.randn(T, device=DEV) / math.sqrt(T)
            return (lambda: toeplitz_mix_step(x, w, backend="triton")), []

        cases.append(Case(f"toeplitz decode step b={Bd} t={T}", "lt2dsl", step, bytes=Bd * T * C * 2))
    return cases


def toeplitz_accuracy(T: int, B: int, C: int) -> dict:
    """Relative RMS error against float64 (by FFT) at the benchmark shape: y and, for ours, the
    gradients, next to the dense bf16 product's y (w rounded to bf16 as its matrix is)."""
    from lt2dsl.kernels import toeplitz_mix
    from lt2dsl.kernels.toeplitz import fft_toeplitz_mix

    def rel(a, r):
        return float((a.detach().double() - r.detach()).norm() / r.detach().norm())

    gen = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(B, T, C, device=DEV, generator=gen).to(TDT)
    w = torch.randn(T, device=DEV, generator=gen) / math.sqrt(T)
    dy = torch.randn(B, T, C, device=DEV, generator=gen).to(TDT)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    ref = fft_toeplitz_mix(xd, wd.view(1, 1, T))
    (ref * dy.double()).sum().backward()
    out = {}
    for method in ("blocked", "fft"):
        xl, wl = _leaf(x), _leaf(w)
        y = toeplitz_mix(xl, wl, backend="triton", method=method)
        y.backward(dy)
        out[method] = {"y": rel(y, ref), "dx": rel(xl.grad, xd.grad), "dw": rel(wl.grad, wd.grad)}
    lag = torch.arange(T, device=DEV)[:, None] - torch.arange(T, device=DEV)[None, :]
    Md = torch.where(lag >= 0, w.to(TDT)[lag.clamp(min=0)], 0.0)
    del lag
    out["dense"] = {"y": rel(torch.einsum("ts,bsc->btc", Md, x), ref)}
    return out


def cases() -> list[Case]:
    all_cases = train_cases() + decode_cases() + toeplitz_cases(**TOEPLITZ)
    only = [s for s in os.environ.get("ONLY", "").split(",") if s]
    return [c for c in all_cases if not only or any(s in c.group for s in only)]


def smoke() -> None:
    """Build and run every lt2dsl case once (forward, and backward where timed) without timing."""
    for c in cases():
        if c.impl not in ("lt2dsl", "lt2dsl, w new", "lt2dsl fft", "dense", "dense+build", "torch.fft"):
            continue
        fn, _ = c.make()
        out = fn()
        out = out[0] if isinstance(out, tuple | list) else out
        if c.backward:
            out.float().sum().backward()
        assert torch.isfinite(out.float()).all(), c.group
        print(f"ok {c.group:40s} {c.impl:10s} {'fwd+bwd' if c.backward else 'fwd'}", flush=True)


def main() -> None:
    if SMOKE:
        smoke()
        return
    ceilings = measure_ceilings()
    print(
        f"ceilings: copy {ceilings['copy_GBps']:.0f} GB/s, bf16 matmul {ceilings['bf16_TFLOPs']:.0f} TFLOP/s"
    )
    tag = os.environ.get("TAG", "")
    rows = run_cases("kernels_decay" + (f"_{tag}" if tag else ""), cases(), ceilings)
    print(summary_table(rows, baseline_impl="fla"))
    toeplitz = [r for r in rows if r["group"].startswith("toeplitz B")]
    if toeplitz:
        print(summary_table(toeplitz, baseline_impl="dense"))
        acc = toeplitz_accuracy(**TOEPLITZ)
        print("toeplitz relative RMS error vs float64:", json.dumps(acc))
        with open(os.path.join(os.environ.get("OUT", "."), "toeplitz_accuracy.json"), "w") as fh:
            json.dump(acc, fh, indent=1)


if __name__ == "__main__":
    main()
