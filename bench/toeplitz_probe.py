"""Where the blocked Toeplitz path's time goes on the GPU: each pass at each of its candidate configs,
the host time of one call, and the whole op, at the benchmark shape (B=1, T=32768, C=1024, bf16).

    python3 bench/toeplitz_probe.py          # prints a table, writes $OUT/toeplitz_probe.json

Figures for the record come from bench/kernels_decay.py (side by side with the dense product);
this says which pass and which config to work on. `T`, `C`, `B` override the shape.
"""

from __future__ import annotations

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    from triton.testing import do_bench

    from bench.launch_probe import per_call_us
    from lt2dsl.kernels import toeplitz_mix
    from lt2dsl.kernels.common.decay_triton import force_config
    from lt2dsl.kernels.toeplitz import blocked as bl
    from lt2dsl.kernels.toeplitz.blocked_ref import block_size

    T, C, B = (int(os.environ.get(k, d)) for k, d in (("T", 32768), ("C", 1024), ("B", 1)))
    S = block_size(T)
    dev = "cuda"
    x = torch.randn(B, T, C, device=dev).bfloat16()
    w = torch.randn(1, T, device=dev) / math.sqrt(T)
    bias = torch.zeros(1, T, device=dev)
    plan = bl.Plan(T, S, x.dtype, x.device)
    V = bl.kernel_spectra(w, plan)
    A = bl.block_tiles(V, plan)
    rows = []

    def timed(name, fn, kernel=None):
        n = len(kernel.all_configs) if kernel is not None else 1
        for i in range(n):
            if kernel is not None:
                force_config(i)
            try:
                ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
                cfg = str(kernel.all_configs[i]) if kernel is not None else ""
                rows.append({"pass": name, "config": i, "desc": cfg, "us": ms * 1e3})
            except Exception as e:  # a config out of resources
                rows.append({"pass": name, "config": i, "error": f"{type(e).__name__}: {str(e)[:120]}"})
            finally:
                force_config(None)

    timed("kernel spectra (window DFT)", lambda: bl.kernel_spectra(w, plan))
    timed("pass 2 tiles table", lambda: bl.block_tiles(V, plan))
    layouts = os.environ.get("PROBE_LAYOUTS", "bin").split(",")
    tiles = [int(t) for t in os.environ.get("PROBE_TILES", "32").split(",")]
    for layout in layouts:
        p = bl.Plan(T, S, x.dtype, x.device, layout=layout)
        X = bl.to_spectra(x, p.F, p, C)
        timed(f"{layout}: pass 1 spectra", lambda p=p: bl.to_spectra(x, p.F, p, C), bl.spectra_kernel)
        for tile in tiles:
            bl.TILE = tile
            A = bl.block_tiles(V, p)
            fn = lambda p=p, X=X, A=A: bl.mix(X, V, A, p, C, False)  # noqa: E731
            timed(f"{layout}: pass 2 tiles of {tile}", fn, bl.mix_tiles_kernel)
            timed(f"{layout}: pass 2 table of {tile}", lambda p=p: bl.block_tiles(V, p))
        bl.TILE = tiles[0]
        A = bl.block_tiles(V, p)
        Z = bl.mix(X, V, A, p, C, False)
        samples = lambda p=p, Z=Z: bl.from_spectra(Z, p.G, p, C, bias, x.dtype)  # noqa: E731
        timed(f"{layout}: pass 3 samples+bias", samples, bl.samples_kernel)
        if os.environ.get("PROBE_CORR") == "1":
            fn = lambda p=p, X=X, Z=Z: bl.spectra_grad(Z, X, p, 1)  # noqa: E731
            timed(f"{layout}: correlation dV", fn, bl.corr_kernel)
    plan = bl.Plan(T, S, x.dtype, x.device)
    X = bl.to_spectra(x, plan.F, plan, C)
    Z = bl.mix(X, V, A, plan, C, False)
    F = plan.F
    xv = x.view(B * plan.M, S, C)
    timed("cuBLAS batched F @ x_J (block-major, reference)", lambda: torch.matmul(F, xv))

    # the whole op, autotuned, and the host time of one call (no synchronisation in the loop)
    xl, wl, bl_ = (t.clone().requires_grad_() for t in (x, w[0], bias[0]))
    fwd = lambda: toeplitz_mix(xl, wl, bl_, backend="triton")  # noqa: E731
    for tile in tiles:
        bl.TILE = tile
        bl._TABLES.clear()
        ms = do_bench(fwd, warmup=10, rep=50, return_mode="median")
        rows.append({"pass": f"op forward (tiles of {tile})", "us": ms * 1e3})
        fb_ = lambda: fwd().backward(torch.ones_like(x))  # noqa: E731
        ms = do_bench(fb_, warmup=5, rep=50, grad_to_none=[xl, wl, bl_])
        rows.append({"pass": f"op fwd+bwd (tiles of {tile})", "us": ms * 1e3})
    bl.TILE = tiles[0]
    bl._TABLES.clear()
    from lt2dsl.kernels.common import launch

    # the launches through Triton's own path (LT2_FAST_LAUNCH=0), the kept CompiledKernel's runner
    # and torch's static launcher, side by side in this process
    for mode in ("0", "runner", "static"):
        launch.MODE = mode
        launch._COMPILED.clear()  # kept kernels rebuilt for this path; the autotuner picks stay
        tag = {"0": "triton launch", "runner": "kept kernel, runner", "static": "kept kernel, static"}[mode]
        ms = do_bench(fwd, warmup=10, rep=50, return_mode="median")
        rows.append({"pass": f"op forward ({tag})", "us": ms * 1e3})
        # 20 calls: few enough that the launch queue never fills and blocks the host
        host = per_call_us(fwd, n=20, warmup=5)
        rows.append({"pass": f"op forward: host time per call ({tag})", "us": host})
    dy = torch.randn_like(x)

    def fb():
        fwd().backward(dy)

    rows.append(
        {"pass": "op fwd+bwd", "us": do_bench(fb, warmup=5, rep=50, grad_to_none=[xl, wl, bl_]) * 1e3}
    )

    # host time (no synchronisation) of each piece of one forward, 20 calls each
    xn, wn, bn = x, w[0], bias[0]
    for name, fn in [
        ("host: toeplitz_mix, no grad (eager op)", lambda: toeplitz_mix(xn, wn, bn, backend="triton")),
        ("host: toeplitz_mix, inputs require grad", fwd),
        ("host: blocked_fwd", lambda: bl.blocked_fwd(x, w, bias, S)),
        ("host: kernel_spectra", lambda: bl.kernel_spectra(w, plan)),
        ("host: block_tiles", lambda: bl.block_tiles(V, plan)),
        ("host: to_spectra", lambda: bl.to_spectra(x, plan.F, plan, C)),
        ("host: mix", lambda: bl.mix(X, V, A, plan, C, False)),
        ("host: from_spectra", lambda: bl.from_spectra(Z, plan.G, plan, C, bias, x.dtype)),
        ("host: torch.empty", lambda: torch.empty(B, 2 * S, plan.M, C, device=dev, dtype=torch.bfloat16)),
    ]:
        rows.append({"pass": name, "us": per_call_us(fn, n=20, warmup=3)})
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        fwd()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    print(buf.getvalue()[:6000])

    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "toeplitz_probe.json"), "w") as fh:
        json.dump({"T": T, "C": C, "B": B, "S": S, "rows": rows}, fh, indent=1)
    print(f"toeplitz probe B={B} T={T} C={C} S={S}")
    for r in rows:
        val = f"{r['us']:9.1f} us" if "us" in r else r["error"]
        print(f"{r['pass']:48s} {r.get('config', ''):>3} {val}  {r.get('desc', '')}")


if __name__ == "__main__":
    main()
