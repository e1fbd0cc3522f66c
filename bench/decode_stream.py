"""Can one launch stream a block's four decode projections back to back? (issue 35, GPU only)

The hybrid's decode step is 385 weight products at about a one-launch read's speed (3.7 µs +
bytes / 2.83 TB/s on the H100, `bench/decode_gemv.py`): every launch boundary drains the memory
system, and their sum alone is past what the 70% bar allows the whole step (docs/decode.md,
"Status"). The design that would close it is a persistent per-block kernel; this measures its core
before anyone builds it: the chain of one GDN block's products

    y1 = W_in x;  y2 = W_o y1[:, :Dv];  y3 = W_gu y2;  y4 = W_down (silu(y3_g) · y3_u)

(no norms or mixer: those are a few KB of activations) run five ways, M = 1 and 8 rows, bf16:

* `cuBLAS`: `F.linear` ×4 and the SwiGLU's two torch ops (six launches);
* `split`: the kernel below launched once per product (four launches, the same code as `one`);
* `one`: one launch of `P` = #SMs programs, a grid barrier between products (an int64 counter
  that only grows: a launch adds 3·P, so its base is the count a program reads first rounded down
  to 3·P; the activations between products are read past L1, `.cg`);
* `one+prefetch`: `one`, and each program bulk-prefetches the first `PF` bytes of its next
  product's first tile into L2 before it waits (weights do not depend on the activations);
* `read`: a plain read of the four weights' bytes (no arithmetic), one launch a weight and all
  in one launch: the references.

Then the whole block as `kernels.block.gdn_block_decode` runs it (the products above with the
convs, recurrence and norms between them: six phases in one persistent launch, or six launches)
against the kernels the lowering runs today (`block_rows`); GB/s there counts the four weights.

Each is timed as a CUDA graph over weight copies past L2 (`decode_gemv.time_us`). `one` and
`split` are checked against the float64 chain (relative error) and against each other's bits
before they are timed. A grid barrier needs every program resident at once: P = #SMs, one program
an SM (48 KB of shared memory and 8 warps each: all of them fit; a launch that could not would
hang, so the config is fixed here, not tuned).

Usage:
    PYTHONPATH=. python bench/decode_stream.py [MODEL] [--hw h100] [--out DIR]
MODEL defaults to examples/lt2_hybrid_gdn_dsa.lt2 (its first GDN block's shapes). Prints a rich
table and writes DIR/decode_stream.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lt2dsl.kernels.common.grid_sync import barrier_base, grid_barrier  # noqa: E402
from lt2dsl.kernels.common.tl_util import cast, helper  # noqa: E402
from lt2dsl.kernels.gemv.triton_gemv import _dot  # noqa: E402
from lt2dsl.kernels.prefetch.triton_prefetch import _PREFETCH, CHUNK  # noqa: E402

BN, BK, WARPS, STAGES = 16, 256, 8, 3  # one config for every product: the decode GEMV's narrow one
BM = 16  # tl.dot's smallest tile: the decode rows, padded
PHASES = 4


@helper
def _product(x, w, y, M, N, K, sx, sy, pid, P, SWIGLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr):  # fmt: skip
    """y[:, :N] = f(x) @ W[N, K]ᵀ, tiles of BN outputs t = pid, pid + P, …; f(x) = x[:, :K], or
    silu(x[:, :K]) · x[:, K:2K] with SWIGLU (rounded to bf16 as the unfused torch ops are)."""
    rm = tl.arange(0, BM)
    m_m = rm < M
    for t in range(pid, tl.cdiv(N, BN), P):
        rn = tl.arange(0, BN).to(tl.int64) + t * BN
        m_n = rn < N
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        for k0 in range(0, K, BK):
            rk = k0 + tl.arange(0, BK)
            m_k = rk < K
            m_xk = m_k[:, None] & m_m[None, :]
            b_x = tl.load(x + rm[None, :] * sx + rk[:, None], mask=m_xk, other=0.0, cache_modifier=".cg")
            if SWIGLU:
                b_g = b_x.to(tl.float32)
                b_s = cast(b_g * tl.sigmoid(b_g), tl.bfloat16).to(tl.float32)
                p_u = x + rm[None, :] * sx + K + rk[:, None]
                b_u = tl.load(p_u, mask=m_xk, other=0.0, cache_modifier=".cg")
                b_x = cast(b_s * b_u.to(tl.float32), tl.bfloat16)
            b_w = tl.load(w + rn[:, None] * K + rk[None, :], mask=m_n[:, None] & m_k[None, :], other=0.0)
            acc += _dot(b_w, b_x)
        tl.store(y + rm[None, :] * sy + rn[:, None], cast(acc, tl.bfloat16), mask=m_n[:, None] & m_m[None, :])


@helper
def _prefetch(w, N, K, pid, P, PF: tl.constexpr, CHUNK: tl.constexpr, BN: tl.constexpr):
    """Bulk-prefetch into L2 the first PF bytes of this program's first tile of W[N, K] (rows
    pid·BN …, contiguous: a tile is BN whole rows)."""
    n_chunks: tl.constexpr = PF // CHUNK
    tile_bytes = tl.minimum(N - pid * BN, BN) * K * 2
    start = tl.arange(0, n_chunks).to(tl.int64) * CHUNK
    size = tl.minimum(tile_bytes - start, CHUNK)
    size = tl.where((size > 0) & (pid * BN < N), (size // 16) * 16, 0).to(tl.int32)
    addr = w.to(tl.pointer_type(tl.uint8)) + pid.to(tl.int64) * BN * K * 2 + start
    tl.inline_asm_elementwise(_PREFETCH, "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def chain_kernel(
    x, w1, w2, w3, w4, y1, y2, y3, y4, bar, M, N1, N2, N3, N4, K1, K2, K3, K4,
    PHASE: tl.constexpr, PF: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    CHUNK: tl.constexpr,
):  # fmt: skip
    """PHASE 1-4: that product alone (grid = its tiles); PHASE 0: all four, P programs, a grid
    barrier between them (PF > 0: prefetch the next product's first PF bytes before each wait)."""
    pid, P = tl.program_id(0), tl.num_programs(0)
    if PHASE == 1:
        _product(x, w1, y1, M, N1, K1, K1, N1, pid, P, False, BM, BN, BK)
    elif PHASE == 2:
        _product(y1, w2, y2, M, N2, K2, N1, N2, pid, P, False, BM, BN, BK)
    elif PHASE == 3:
        _product(y2, w3, y3, M, N3, K3, N2, N3, pid, P, False, BM, BN, BK)
    elif PHASE == 4:
        _product(y3, w4, y4, M, N4, K4, N3, N4, pid, P, True, BM, BN, BK)
    else:
        # the counter only grows, by 3·P a launch: the first read of it is within P of the base
        base = barrier_base(bar, 3 * P)
        _product(x, w1, y1, M, N1, K1, K1, N1, pid, P, False, BM, BN, BK)
        if PF > 0:
            _prefetch(w2, N2, K2, pid, P, PF, CHUNK, BN)
        grid_barrier(bar, base + P)
        _product(y1, w2, y2, M, N2, K2, N1, N2, pid, P, False, BM, BN, BK)
        if PF > 0:
            _prefetch(w3, N3, K3, pid, P, PF, CHUNK, BN)
        grid_barrier(bar, base + 2 * P)
        _product(y2, w3, y3, M, N3, K3, N2, N3, pid, P, False, BM, BN, BK)
        if PF > 0:
            _prefetch(w4, N4, K4, pid, P, PF, CHUNK, BN)
        grid_barrier(bar, base + 3 * P)
        _product(y3, w4, y4, M, N4, K4, N3, N4, pid, P, True, BM, BN, BK)


class Chain:
    """The four products' buffers for M rows: weights `ws` (N_i, K_i), activations y1..y4; the
    kernel's K tile and pipeline stages `config`."""

    def __init__(self, ws: list[torch.Tensor], M: int, device: str, config: tuple[int, int] = (BK, STAGES)):
        self.ws, self.M, (self.bk, self.stages) = ws, M, config
        (n1, k1), (n2, k2), (n3, k3), (n4, k4) = (tuple(w.shape) for w in ws)
        assert k2 <= n1 and k3 == n2 and 2 * k4 == n3, (k2, n1, k3, n2, k4, n3)
        self.shape = (n1, n2, n3, n4, k1, k2, k3, k4)
        self.x = torch.randn(M, k1, device=device, dtype=torch.bfloat16)
        self.ys = [torch.empty(M, n, device=device, dtype=torch.bfloat16) for n in (n1, n2, n3, n4)]
        self.bars: dict[int, torch.Tensor] = {}  # one counter a grid size (its base is a multiple of 3·P)

    def launch(self, ws: list[torch.Tensor], phase: int, programs: int = 0, pf: int = 0) -> torch.Tensor:
        n1, n2, n3, n4 = self.shape[:4]
        grid = (programs,) if phase == 0 else (triton.cdiv((n1, n2, n3, n4)[phase - 1], BN),)
        if programs not in self.bars:  # made once: a zeros() per launch would be a timed memset
            self.bars[programs] = torch.zeros(1, device=self.x.device, dtype=torch.int64)
        bar = self.bars[programs]
        meta = {
            "BM": BM,
            "BN": BN,
            "BK": self.bk,
            "CHUNK": CHUNK,
            "num_warps": WARPS,
            "num_stages": self.stages,
        }
        chain_kernel[grid](self.x, *ws, *self.ys, bar, self.M, *self.shape, PHASE=phase, PF=pf, **meta)
        return self.ys[3]

    def split(self, ws: list[torch.Tensor]) -> torch.Tensor:
        for phase in range(1, PHASES + 1):
            out = self.launch(ws, phase)
        return out

    def cublas(self, ws: list[torch.Tensor]) -> torch.Tensor:
        y1 = F.linear(self.x, ws[0])
        y3 = F.linear(F.linear(y1[:, : ws[1].shape[1]], ws[1]), ws[2])
        h = ws[3].shape[1]
        return F.linear(F.silu(y3[:, :h]) * y3[:, h:], ws[3])

    def reference(self) -> torch.Tensor:
        """The chain in float64 on the bf16 inputs (the activations not rounded between products)."""
        w = [t.double() for t in self.ws]
        y1 = self.x.double() @ w[0].T
        y3 = (y1[:, : w[1].shape[1]] @ w[1].T) @ w[2].T
        h = w[3].shape[1]
        return (F.silu(y3[:, :h]) * y3[:, h:]) @ w[3].T


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got = got.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).norm() / ref.norm())


def block_shapes(path: str) -> list[tuple[int, int]]:
    """(N, K) of the model's first GDN block's in-projection (padded as the lowering concatenates
    it), o_proj, gate/up and down (`decode_gemv.shapes`)."""
    from decode_gemv import shapes

    sh = shapes(path)
    return [sh[f"GatedDeltaNet {p}"] for p in ("in", "o_proj", "gate/up", "down")]


def timed(wsets: list, M: int, programs: int, pfs: list[int], copies: int, nbytes: int,
          config: tuple[int, int]) -> list[dict]:  # fmt: skip
    """The chain's rows for M decode rows: each way checked against float64, then timed."""
    from decode_gemv import time_us

    ch = Chain(list(wsets[0]), M, "cuda", config)
    ref = ch.reference()
    cases = {
        "cuBLAS": lambda ws: ch.cublas(ws),
        "split": lambda ws: ch.split(ws),
        "one": lambda ws: ch.launch(ws, 0, programs),
        **{f"one+prefetch {pf // 1024} KB": (lambda ws, pf=pf: ch.launch(ws, 0, programs, pf)) for pf in pfs},
    }
    split = ch.split(ch.ws).clone()
    rows = []
    for name, fn in cases.items():
        got = fn(ch.ws).clone()  # the chain writes its output buffer again at every timed call
        same = None if name == "cuBLAS" else bool(torch.equal(got, split))
        us = time_us(lambda i, fn=fn: fn(wsets[i]), copies)
        rows.append({"case": name, "M": M, "us": us, "rel_err": rel_err(got, ref), "same_bits_as_split": same,
                     "GBps": nbytes / us / 1e3})  # fmt: skip
    return rows


TODAY, SPLIT, ONE = (
    "block: lowering's kernels today (8 launches)",
    "block: six phases (6 launches)",
    "block: one launch",
)
HYBRID_BLOCK = (2048, 16, 16, 128, 256, 5632)  # (D, H, HV, K, V, F) of the hybrid's GDN block


def block_cases(
    M: int, shape: tuple[int, ...], device: str, persistent_programs: int | None = None,
    config=None,
):  # fmt: skip
    """(cases, inputs, bytes of the four weights): the hybrid's whole GDN block for M rows as
    `kernels.block.gdn_block_decode` runs it (one persistent launch; six launches) and as the
    kernels the lowering runs today do (cuBLAS products, `gdn_step`'s two launches,
    `add_rmsnorm`, `swiglu`: eight launches). Each case maps a dict of inputs to (h2, y)."""
    from lt2dsl.kernels import fused
    from lt2dsl.kernels.block import gdn_block_decode
    from lt2dsl.kernels.block.testing import as_dtype, inputs
    from lt2dsl.kernels.delta.gdn_step import gdn_step

    D, H, HV, K, V, FF = shape
    args, kw = inputs(False, 0, (M, *shape))
    base = as_dtype({k: (v.to(device) if torch.is_tensor(v) else v) for k, v in args.items()}, torch.bfloat16)
    base["conv_weights"] = tuple(w.to(device) for w in base["conv_weights"])
    base["hists"] = tuple(h.to(device) for h in base["hists"])
    q0, k0, v0, z0, a0, b0 = base["offsets"]

    def today(a):
        y1 = F.linear(a["xn"], a["w_in"])[:, None]
        cols = ((q0, H * K), (k0, H * K), (v0, HV * V), (a0, HV), (b0, HV), (z0, HV * V))
        xq, xk, xv, xa, xb, xz = (y1[..., o : o + n] for o, n in cols)
        on = gdn_step(xq, xk, xv, xa, xb, xz, a["conv_weights"], a["conv_biases"], a["hists"], a["A_log"],
                      a["dt_bias"], a["state"], a["gamma_o"], heads=H, scale=kw["scale"],
                      beta_scale=kw["beta_scale"], eps=kw["eps_o"])  # fmt: skip
        n2, h2 = fused.add_rmsnorm(a["res"], F.linear(on.flatten(1), a["w_o"]), a["gamma2"], kw["eps2"])
        gu = F.linear(n2, a["w_gu"])
        return h2, F.linear(fused.swiglu(gu[:, :FF], gu[:, FF:]), a["w_down"])

    cases = {
        TODAY: today,
        SPLIT: lambda a: gdn_block_decode(**a, **kw, persistent=False, config=config),
        ONE: lambda a: gdn_block_decode(
            **a, **kw, persistent=True, programs=persistent_programs, config=config
        ),
    }
    nbytes = sum(base[w].numel() * 2 for w in ("w_in", "w_o", "w_gu", "w_down"))
    return cases, base, nbytes


def block_rows(M: int, copies: int, config) -> list[dict]:
    """`block_cases` on the card: each case from the same inputs (the state and histories copied),
    compared with today's kernels and with the six launches' bits, then timed over weight copies
    past L2 (each call updates its copy's state in place, as a decode step does)."""
    from decode_gemv import time_us

    from lt2dsl.kernels.block.testing import as_dtype

    cases, base, nbytes = block_cases(M, HYBRID_BLOCK, "cuda", config=config)
    ws = ("w_in", "w_o", "w_gu", "w_down")
    sets = [base] + [{**base, **{w: base[w].clone() for w in ws}} for _ in range(copies - 1)]
    outs = {n: fn(as_dtype(base, torch.bfloat16)) for n, fn in cases.items()}
    rows = []
    for name, fn in cases.items():
        err = max(rel_err(g, r.double()) for g, r in zip(outs[name], outs[TODAY]))
        same = all(torch.equal(a, b) for a, b in zip(outs[name], outs[SPLIT]))
        us = time_us(lambda i, fn=fn: fn(sets[i]), copies)
        rows.append({"case": name, "M": M, "us": us, "rel_err": err, "GBps": nbytes / us / 1e3,
                     "same_bits_as_split": bool(same)})  # fmt: skip
    return rows


def main() -> None:
    from decode_gemv import n_copies, read_us, weights
    from rich.console import Console
    from rich.table import Table

    from lt2dsl.cost.hardware import load_hardware
    from lt2dsl.kernels.block import CONFIGS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", default=str(ROOT / "examples" / "lt2_hybrid_gdn_dsa.lt2"))
    p.add_argument("--hw", default="h100", help="hardware preset of the HBM peak [h100]")
    p.add_argument("--out", type=Path, default=Path("."), help="folder of decode_stream.json [.]")
    p.add_argument(
        "--prefetch", default="65536", help="PF bytes of the prefetch rows, comma-separated [65536]"
    )
    p.add_argument("--configs", default="", help="indices into block.CONFIGS to time, comma-separated [all]")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: bench/decode_stream.py times CUDA kernels; no CUDA device is available")
    peak = load_hardware(args.hw).hbm_bytes_per_s
    nk = block_shapes(args.model)
    # o_proj reads the value part of the in-projection's output; its K must fit in N_in
    c = n_copies(*nk)
    wsets = list(zip(*(weights(n, k, c) for n, k in nk), strict=True))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    nbytes = sum(2 * n * k for n, k in nk)
    pfs = [int(v) for v in args.prefetch.split(",")]
    read = read_us(nk)
    one_read = read_us([(nbytes // 2, 1)])
    rows = []
    chain = [r for M in (1, 8) for r in timed(wsets, M, sms, pfs, c, nbytes, (BK, STAGES))]
    rows += [{**r, "case": r["case"] + ("" if r["case"] == "cuBLAS" else f" [BK {BK}]")} for r in chain]
    chosen = [int(i) for i in args.configs.split(",")] if args.configs else range(len(CONFIGS))
    for i, cfg in [(i, CONFIGS[i]) for i in chosen]:  # the block at each of its product tiles
        tiles = f"{cfg.bn_wide}x{cfg.bk_wide}/{cfg.bn_narrow}x{cfg.bk_narrow}{', flat' if cfg.flat else ''}"
        tag = f" [config {i}: {tiles}]"
        for r in [r for M in (1, 8) for r in block_rows(M, c, cfg)]:
            if r["case"] != TODAY or i == chosen[0]:
                rows.append(
                    {**r, "case": r["case"] + ("" if r["case"] == TODAY else tag), "config": list(cfg)}
                )
    for name, us in (("read, one launch a weight", read), ("read, all in one launch", one_read)):
        rows.append({"case": name, "M": None, "us": us, "rel_err": None, "GBps": nbytes / us / 1e3})
    card = torch.cuda.get_device_name()
    t = Table(
        title=f"one GDN block's four decode products ({nbytes / 1e6:.1f} MB), {card}, bf16, CUDA graphs"
    )
    for col in ("case", "M", "µs", "GB/s", "% peak", "rel err (block: vs today's)"):
        t.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        r["pct_peak"] = 100 * r["GBps"] * 1e9 / peak
        err = "" if r["rel_err"] is None else f"{r['rel_err']:.1e}"
        t.add_row(
            r["case"], str(r["M"] or ""), f"{r['us']:.1f}", f"{r['GBps']:.0f}", f"{r['pct_peak']:.0f}", err
        )
    Console().print(t)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "hw": args.hw, "shapes": nk, "bytes": nbytes, "programs": sms,
            "chain (BN, BK, warps, stages)": (BN, BK, WARPS, STAGES),
            "block configs": [c._asdict() for c in CONFIGS]}  # fmt: skip
    tmp = args.out / "decode_stream.json.tmp"
    tmp.write_text(json.dumps({**meta, "rows": rows}, indent=1))
    os.replace(tmp, args.out / "decode_stream.json")


if __name__ == "__main__":
    main()
