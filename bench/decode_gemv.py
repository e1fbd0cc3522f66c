"""The decode GEMV (`lt2dsl.kernels.gemv`) against cuBLAS and the unfused chain, at the shapes of a
model's blocks, under CUDA graphs (GPU only).

Two kinds of rows, for M = 1 and 8 decode rows, bf16:

* `gemv <proj>`: one projection alone, `gemv(x, W)` against `F.linear(x, W)` (cuBLAS): whether the
  kernel streams a weight as fast as cuBLAS does;
* `GatedDeltaNet gated norm + o_proj + residual`: the GDN output's gated RMSNorm in the GEMV's
  prologue against the gated-norm kernel, `F.linear` and the add;
* `<proj> -> <next>`: what one `decode_gemv` node launches (`gemv(x, W, residual)`, then
  `gemv(s, W_next, rmsnorm[, swiglu])`) against the nodes it replaces (`F.linear`, `add_rmsnorm`,
  `F.linear` of the split[, `swiglu`]).

Each call is timed as a CUDA graph (`triton.testing.do_bench_cudagraph`, median) over enough copies
of its weights that they do not fit in L2 (a decode step reads each layer's weights once);
GB/s = the weights' bytes per call / time, next to the card's HBM peak (`--hw`). Each row also has
cuBLAS's GB/s and a plain read's: one launch of a streaming read of the same bytes (4 programs an
SM, 64 KB tiles, no arithmetic), the reference of what one launch of that size reads at (a
product may beat it by a little: it is no hard ceiling).

Usage (the model's shapes: its first GDN and first DSA block, dim, hidden, projections):
    PYTHONPATH=. python bench/decode_gemv.py [examples/lt2_hybrid_gdn_dsa.lt2] [--hw h100] [--out DIR]
Prints a rich table and writes DIR/decode_gemv.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

L2_SPAN = 256 * 2**20  # bytes of weight copies a timed call rotates through: past any L2
ROWS = (1, 8)


def shapes(path: str) -> dict[str, tuple[int, int]]:
    """{name: (N, K)} of the projections of the model's first block of each mixer kind: the
    concatenated in-projection (outputs padded as `fused.concat_weights` pads them), o_proj, the
    MLP's gate/up concatenation and down_proj."""
    import lt2dsl
    from lt2dsl.kernels.fused import CAT_ALIGN

    model = lt2dsl.compile(path, device="meta")
    out, dim = {}, model.config.dim
    for block in model.blocks:
        kind = type(block.mixers[0]).__name__
        if any(k.startswith(kind) for k in out):
            continue
        lin = {n: m.weight.shape for n, m in block.named_modules() if isinstance(m, nn.Linear)}
        ins = [s[0] for n, s in lin.items() if n.startswith("mixers.0.") and s[1] == dim]
        n_in = sum(ins) - (lin["mixers.0.o_proj"][0] if lin["mixers.0.o_proj"][1] == dim else 0)
        out[f"{kind} in"] = (-(-n_in // CAT_ALIGN) * CAT_ALIGN, dim)
        out[f"{kind} o_proj"] = tuple(lin["mixers.0.o_proj"])
        out[f"{kind} gate/up"] = (2 * lin["mlp.gate_proj"][0], dim)
        out[f"{kind} down"] = tuple(lin["mlp.down_proj"])
    return out


def weights(N: int, K: int, copies: int) -> list[torch.Tensor]:
    return [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / math.sqrt(K) for _ in range(copies)]


def n_copies(*nk: tuple[int, int]) -> int:
    return max(1, math.ceil(L2_SPAN / sum(2 * n * k for n, k in nk)))


@functools.cache
def read_kernel():
    """A Triton kernel that reads `n` bf16 values in BLOCK tiles, program p taking tiles p, p + P,
    …, and writes one fp32 sum per program (so the loads are not dropped)."""
    import triton
    import triton.language as tl

    @triton.jit
    def stream_read(src, dst, n, BLOCK: tl.constexpr):
        pid, P = tl.program_id(0), tl.num_programs(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(pid * BLOCK, n, P * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(src + offs, mask=offs < n, other=0.0).to(tl.float32)
        tl.store(dst + pid, tl.sum(acc, 0))

    return stream_read


def read_us(nk: list[tuple[int, int]]) -> float:
    """µs of the plain read of weights of these shapes, one launch each, as `time_us` times a case."""
    kernel = read_kernel()
    c = n_copies(*nk)
    ws = [weights(n, k, c) for n, k in nk]
    progs = 4 * torch.cuda.get_device_properties(0).multi_processor_count
    dst = torch.empty(progs, device="cuda", dtype=torch.float32)

    def fn(i):
        for w in ws:
            kernel[(progs,)](w[i], dst, w[i].numel(), BLOCK=32768, num_warps=8)

    return time_us(fn, c)


def time_us(fn, copies: int) -> float:
    """µs per call of `fn(i)` (i: the weight copy), replayed as a CUDA graph over every copy."""
    from triton.testing import do_bench_cudagraph

    def run():
        for i in range(copies):
            fn(i)

    run()  # autotuning and lazy setup outside the capture
    torch.cuda.synchronize()
    return do_bench_cudagraph(run, rep=20, return_mode="median") * 1e3 / copies


def single(name: str, N: int, K: int, M: int) -> dict:
    from lt2dsl.kernels.gemv import gemv

    c = n_copies((N, K))
    ws, x = weights(N, K, c), torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    fused = time_us(lambda i: gemv(x, ws[i]), c)
    base = time_us(lambda i: F.linear(x, ws[i]), c)
    row = {"case": f"gemv {name}", "M": M, "bytes": 2 * N * K, "fused_us": fused, "unfused_us": base}
    return {**row, "read_us": read_us([(N, K)])}


def pair(name: str, first: tuple[int, int], nxt: tuple[int, int], M: int, swiglu: bool) -> dict:
    """One `decode_gemv` node: proj (first) + residual, add-norm, next projection [+ SwiGLU]."""
    from lt2dsl.kernels import fused
    from lt2dsl.kernels.gemv import gemv

    (D, K1), (N2, _) = first, nxt
    c = n_copies(first, nxt)
    w1, w2 = weights(D, K1, c), weights(N2, D, c)
    x = torch.randn(M, K1, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(M, D, device="cuda", dtype=torch.bfloat16)
    gamma = torch.ones(D, device="cuda", dtype=torch.bfloat16)
    half = N2 // 2

    def fused_node(i):
        s = gemv(x, w1[i], residual=res)
        kw = {"up": half, "width": half} if swiglu else {}
        return gemv(s, w2[i], norm_weight=gamma, eps=1e-6, **kw)

    def unfused(i):
        n, _ = fused.add_rmsnorm(res, F.linear(x, w1[i]), gamma, 1e-6)
        y = F.linear(n, w2[i])
        return fused.swiglu(y[:, :half], y[:, half:]) if swiglu else y

    fu, base = time_us(fused_node, c), time_us(unfused, c)
    row = {"case": name, "M": M, "bytes": 2 * (D * K1 + N2 * D), "fused_us": fu, "unfused_us": base}
    return {**row, "read_us": read_us([first, nxt])}


def gated(name: str, o_proj: tuple[int, int], group: int, M: int) -> dict:
    """GDN's output: fla's gated RMSNorm over each head's `group` channels · silu(gate), o_proj and
    the residual add, as `gemv(o, W, norm_weight, gate, group, residual)` (one launch) against the
    gated-norm kernel, `F.linear` and the add."""
    from lt2dsl.kernels import fused
    from lt2dsl.kernels.fused.triton_norm import gated_rmsnorm_fwd
    from lt2dsl.kernels.gemv import gemv

    D, K = o_proj
    c = n_copies(o_proj)
    w = weights(D, K, c)
    o, z = (torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    res = torch.randn(M, D, device="cuda", dtype=torch.bfloat16)
    gamma = torch.ones(group, device="cuda", dtype=torch.bfloat16)

    def fused_node(i):
        return gemv(o, w[i], norm_weight=gamma, eps=1e-6, gate=z, group=group, residual=res)

    def unfused(i):
        n = gated_rmsnorm_fwd(o, z, gamma, 1e-6, fused.ACT_CODES["silu"], group, True)
        return res + F.linear(n, w[i])

    fu, base = time_us(fused_node, c), time_us(unfused, c)
    row = {"case": name, "M": M, "bytes": 2 * D * K, "fused_us": fu, "unfused_us": base}
    return {**row, "read_us": read_us([o_proj])}


def gdn_group(path: str) -> int | None:
    """The head value width of the model's first GDN block (its output norm's γ), None without one."""
    import lt2dsl

    for block in lt2dsl.compile(path, device="meta").blocks:
        mixer = block.mixers[0]
        if type(mixer).__name__ == "GatedDeltaNet":
            norms = [p for n, p in mixer.named_parameters() if "norm" in n and p.dim() == 1]
            return norms[0].shape[0] if norms else None
    return None


def cases(sh: dict[str, tuple[int, int]], M: int, group: int | None = None) -> list[dict]:
    rows = [single(name, *nk, M) for name, nk in sh.items()]
    if group is not None and "GatedDeltaNet o_proj" in sh:
        name = "GatedDeltaNet gated norm + o_proj + residual"
        rows.append(gated(name, sh["GatedDeltaNet o_proj"], group, M))
    kinds = list(dict.fromkeys(k.split()[0] for k in sh))
    for i, kind in enumerate(kinds):
        nxt = kinds[(i + 1) % len(kinds)]
        mlp = (sh[f"{kind} o_proj"], sh[f"{kind} gate/up"])
        rows.append(pair(f"{kind} o_proj -> gate/up+swiglu", *mlp, M, True))
        rows.append(pair(f"{kind} down -> {nxt} in", sh[f"{kind} down"], sh[f"{nxt} in"], M, False))
    return rows


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    from lt2dsl.cost.hardware import load_hardware

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", default=str(ROOT / "examples" / "lt2_hybrid_gdn_dsa.lt2"))
    p.add_argument("--hw", default="h100", help="hardware preset of the HBM peak [h100]")
    p.add_argument("--out", type=Path, default=Path("."), help="folder of decode_gemv.json [.]")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: bench/decode_gemv.py times CUDA kernels; no CUDA device is available")
    peak = load_hardware(args.hw).hbm_bytes_per_s
    sh, group = shapes(args.model), gdn_group(args.model)
    rows = [r for M in ROWS for r in cases(sh, M, group)]
    card = torch.cuda.get_device_name()
    t = Table(title=f"decode GEMV vs cuBLAS + unfused chain, {card}, bf16, CUDA graphs")
    cols = ("case", "M", "MB", "fused µs", "unfused µs", "speedup", "fused GB/s", "cuBLAS GB/s", "read GB/s",
            "% peak")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        for k in ("fused", "unfused", "read"):
            r[f"{k}_GBps"] = r["bytes"] / r[f"{k}_us"] / 1e3
        r["pct_peak"] = 100 * r["fused_GBps"] * 1e9 / peak
        t.add_row(r["case"], str(r["M"]), f"{r['bytes'] / 1e6:.1f}", f"{r['fused_us']:.1f}",
                  f"{r['unfused_us']:.1f}", f"{r['unfused_us'] / r['fused_us']:.2f}x",
                  f"{r['fused_GBps']:.0f}", f"{r['unfused_GBps']:.0f}", f"{r['read_GBps']:.0f}",
                  f"{r['pct_peak']:.0f}")  # fmt: skip
    Console().print(t)
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "decode_gemv.json.tmp"
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "hw": args.hw, "shapes": sh}
    tmp.write_text(json.dumps({**meta, "rows": rows}, indent=1))
    os.replace(tmp, args.out / "decode_gemv.json")


if __name__ == "__main__":
    main()
