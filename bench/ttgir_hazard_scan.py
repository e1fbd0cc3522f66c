"""Offline scan of every Triton kernel the ops launch for the wgmma pipelining race (`ttgir_checks`).

Two steps, no GPU. `capture`: runs each op forward and backward under the CPU interpreter at a
small length but real head dims (B=1, T=128, H=2, D=128, bf16) and records every kernel launch's
argument types and constexprs. `compile`: compiles each recorded kernel for sm_90 at a matrix of
(warps, stages) and reports `bench.ttgir_checks.pipeline_hazards` (a single-buffered
operand of asynchronous wgmma dots while dots stay pending). A flagged config matters only if it
is among that kernel's candidates; the sm_90 compile check (`make sm90`, tests/kernels/aot_check.py)
asserts every kernel's candidates.

    TRITON_INTERPRET=1 python3 bench/ttgir_hazard_scan.py capture /tmp/launches.json
    TRITON_DEFAULT_FP_FUSION=1 python3 bench/ttgir_hazard_scan.py compile /tmp/launches.json
    TRITON_DEFAULT_FP_FUSION=1 python3 bench/ttgir_hazard_scan.py candidates /tmp/launches.json

The kernels whose launches do not compile from a CPU capture (attention, DSA, NSA: interpreter-only
tiles and types) are covered by their own compile tests.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MATRIX = [(2, 2), (2, 3), (4, 1), (4, 2), (4, 3), (8, 2), (8, 3)]
TYPES = {
    "torch.bfloat16": "*bf16",
    "torch.float16": "*fp16",
    "torch.float32": "*fp32",
    "torch.float64": "*fp64",
    "torch.int32": "*i32",
    "torch.int64": "*i64",
    "torch.bool": "*i1",
}


def _exercise():
    import torch

    from lt2dsl.kernels import dsa, gla, mlstm, nsa, simple_gla, toeplitz_mix

    torch.manual_seed(0)
    B, T, H, D = 1, 128, 2, 128

    def rnd(*s, scale=1.0):
        return (torch.randn(*s) * scale).to(torch.bfloat16).requires_grad_()

    def back(out):
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()

    q, k, v = rnd(B, T, H, D), rnd(B, T, H, D), rnd(B, T, H, D)
    g = (-torch.rand(B, T, H) * 0.1).requires_grad_()
    back(simple_gla(q, k, v, g, backend="triton"))
    back(simple_gla(q, k, v, None, backend="triton"))
    gk = (-torch.rand(B, T, H, D) * 0.1).requires_grad_()
    back(gla(q, k, v, gk, backend="triton"))
    i, f = torch.randn(B, T, H).requires_grad_(), (torch.randn(B, T, H) + 3).requires_grad_()
    back(mlstm(q, k, v, i, f, backend="triton"))
    x = rnd(B, T, 4 * D)
    w4 = torch.randn(4, T, requires_grad=True)  # 4 heads
    back(toeplitz_mix(x, w4, backend="triton"))  # blocked DFTs (bf16 x)
    back(toeplitz_mix(x, w4, backend="triton", method="fft"))
    k1, v1 = rnd(B, T, 1, D), rnd(B, T, 1, D)
    qi, ki, wi = rnd(B, T, 4, D), rnd(B, T, D), rnd(B, T, 4)
    back(dsa(q, k1, v1, qi, ki, wi, topk=16, backend="triton"))
    qn = rnd(B, T, 16, 64)
    kn, vn = rnd(B, T, 1, 64), rnd(B, T, 1, 64)
    gates = [torch.rand(B, T, 16, requires_grad=True) for _ in range(3)]
    back(nsa(qn, kn, vn, *gates, block_counts=2, block_size=16, window_size=32, backend="triton"))


def capture(path: str) -> None:
    from triton.runtime import interpreter

    launches = {}
    run = interpreter.InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        params = inspect.signature(fn).parameters
        names = list(params)
        values = dict(zip(names, args), **{k: v for k, v in kwargs.items() if k in params})
        sig, cex = {}, {}
        for n in names:
            val = values.get(n, params[n].default)
            if "constexpr" in str(params[n].annotation) or val is None:
                cex[n] = val if not hasattr(val, "value") else val.value
            elif hasattr(val, "dtype") and hasattr(val, "data_ptr"):
                sig[n] = TYPES.get(str(val.dtype), "*fp32")
            elif isinstance(val, bool):
                cex[n] = val
            elif isinstance(val, int):
                sig[n] = "i64" if abs(val) >= 2**31 else "i32"
            elif isinstance(val, float):
                sig[n] = "fp32"
            else:
                cex[n] = val
        key = json.dumps([fn.__module__, fn.__name__, sig, cex], sort_keys=True, default=str)
        launch = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
        launches[key] = {"module": fn.__module__, "name": fn.__name__, "sig": sig, "cex": cex, **launch}
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = recording
    _exercise()
    with open(path, "w") as fh:
        json.dump(list(launches.values()), fh, indent=1, default=str)
    print(f"{len(launches)} distinct launches recorded in {path}")


def scan(path: str, candidates: bool = False) -> tuple[list, int, list]:
    """(hazards, configs compiled, launches that did not compile) for the recorded launches: at
    each kernel's own candidates (`candidates`: an autotuned kernel's full config list, a plain
    launch's recorded warps and stages) or at the whole MATRIX."""
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.autotuner import Autotuner

    from bench.ttgir_checks import pipeline_hazards

    with open(path) as fh:
        launches = json.load(fh)
    hazards, compiled, failed = [], 0, []
    for rec in launches:
        kern = getattr(importlib.import_module(rec["module"]), rec["name"])
        fn = kern.fn if isinstance(kern, Autotuner) else kern
        sig = {n: rec["sig"].get(n, "constexpr") for n in fn.arg_names}
        cex = {(fn.arg_names.index(n),): v for n, v in rec["cex"].items() if n in fn.arg_names}
        attrs = {
            (i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n].startswith("*")
        }
        if not candidates:
            configs = MATRIX
        elif isinstance(kern, Autotuner):
            configs = sorted({(c.num_warps, c.num_stages) for c in kern.configs})
        else:
            configs = [(rec.get("num_warps", 4), rec.get("num_stages", 3))]
        for warps, stages in configs:
            src = ASTSource(fn=fn, signature=sig, constexprs=cex, attrs=attrs)
            opts = {"num_warps": warps, "num_stages": stages}
            try:
                k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
            except Exception as e:  # a config that cannot compile is no hazard; reported apart
                failed.append(f"{rec['name']} w{warps}s{stages}: {type(e).__name__}")
                continue
            compiled += 1
            hits = pipeline_hazards(k.asm["ttgir"])
            if hits:
                hazards.append(f"{rec['module']}.{rec['name']} w{warps}s{stages}: {hits}")
    return hazards, compiled, failed


def compile_all(path: str, candidates: bool = False) -> None:
    hazards, compiled, failed = scan(path, candidates)
    for f in failed:
        print("does not compile:", f)
    for h in hazards:
        print("HAZARD", h)
    print(f"{compiled} kernel configs compiled, {len(failed)} did not; {len(hazards)} flagged")


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "capture":
        capture(path)
    else:  # "compile" (the whole matrix) or "candidates" (each kernel's own configs)
        compile_all(path, candidates=mode == "candidates")
