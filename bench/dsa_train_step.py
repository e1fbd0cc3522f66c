"""One training step of one mixer layer at the distillation shape: DSA against GDN and full attention.

`bench/distill_gpu.py`'s GDN+DSA student trained ~20× slower than its all-GDN one. This times what one
mixer costs in the trainer's step: forward + backward of the mixer alone (no MLP, no norm), fp32
weights under bf16 autocast, on one packed row of `--rows` rows of `--seq` tokens whose documents
start at every row and at `--docs` random points besides (the trainer's packed batches). Rows:

* `full`, `gdn`: the attention and GDN mixers (`full`, `gdn(expand_v=1)`), for scale;
* `dsa`: the DSA mixer alone (indexer, top-k, sparse attention);
* `dsa+kl`: plus the indexer's KL loss over the selected keys as the trainer adds it (its default
  `indexer_loss = 1`, `indexer_loss_keys = "selected"`): `SparseAttention.indexer_loss`, whose KL
  runs the fused Triton kernels (`kernels/dsa/triton_loss.py`) on the GPU;
* `dsa+kl-eager`: the same loss with the KL on `dsa_indexer_kl`'s eager form (`backend="reference"`:
  the selected keys gathered per query chunk in torch, chunks checkpointed);
* `dsa+kl-legacy`: the same loss computed as `indexer_loss` did before it went through
  `dsa_indexer_kl` in one pass: each document alone, 256 queries at a time, every chunk checkpointed
  with its own indexer call and dense `[B, H, 256, t]` scores;
* `dsa+kl-all`: the dense warm-up's loss (`indexer_loss_keys = "all"`).

Each row: the median wall ms of `--steps` steps after two warm-up steps (CUDA events around the
whole step, so host time counts), tokens/s, the aten ops one step dispatches, peak memory, the KL of
the last step (`dsa+kl`, `-eager` and `-legacy` agree to the rounding of their scores), and the
cost model's training FLOPs of the mixer (`spec.flops`, × (1 + backward factor); the KL is not in
it) as the ms it takes at the card's bf16 peak and the share of it in the measured time.

    python bench/dsa_train_step.py --out $OUT/dsa_step --steps 3  # GPU: every row, compiles included
    python bench/dsa_train_step.py --out $OUT/dsa_step --steps 3 --only dsa,dsa+kl,dsa+kl-eager  # the KL
    python bench/dsa_train_step.py --smoke --out /tmp/dsa_step    # CPU, toy sizes: it runs; no claims
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lt2dsl  # noqa: E402
from lt2dsl.kernels.dsa.reference import dsa_indexer_kl_reference  # noqa: E402
from lt2dsl.lowering.packed import split  # noqa: E402

ROWS = ("full", "gdn", "dsa", "dsa+kl", "dsa+kl-eager", "dsa+kl-legacy", "dsa+kl-all")
# the distillation shape of bench/distill_gpu.py; SMOKE: toy sizes
SIZES = {
    "gpu": dict(dim=768, heads=12, kv_heads=4, head_dim=64, topk=256, rows=32, seq=1024, docs=8),
    "smoke": dict(dim=32, heads=4, kv_heads=2, head_dim=8, topk=8, rows=2, seq=48, docs=2),
}
MIXERS = {
    "full": "full",
    "gdn": "gdn(expand_v=1)",
    "dsa": "dsa(topk={topk}, index_heads={kv_heads}, index_dim={head_dim})",
}


def args_of(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="where dsa_train_step.json goes")
    p.add_argument("--steps", type=int, default=5, help="timed steps per row")
    p.add_argument("--only", default=",".join(ROWS), help=f"rows to run, of {', '.join(ROWS)}")
    p.add_argument("--smoke", action="store_true", help="CPU, toy sizes: the script runs; no claims")
    return p.parse_args(argv)


def mixer(kind: str, s: dict, device: str):
    """The mixer layer of a one-block program, fp32 weights."""
    text = (
        f"model m {{\n  dim = {s['dim']}\n  vocab = 256\n  heads = {s['heads']}\n"
        f"  kv_heads = {s['kv_heads']}\n  head_dim = {s['head_dim']}\n  mlp = none\n"
        f"  {MIXERS[kind].format(**s)}\n}}\n"
    )
    backend = "reference" if device == "cpu" else "auto"
    model = lt2dsl.compile(text, backend=backend, dtype=torch.float32, device=device, fuse=False)
    return model.blocks[0].mixers[0].train()


def packed_row(s: dict, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x `[1, rows·seq, dim]` and its int32 `cu_seqlens`: a start at every row and `docs` more."""
    T = s["rows"] * s["seq"]
    g = torch.Generator().manual_seed(0)
    extra = torch.randint(1, T, (s["docs"],), generator=g).tolist()
    cu = sorted(set(range(0, T, s["seq"])) | set(extra) | {T})
    x = torch.randn(1, T, s["dim"], generator=g).to(device).requires_grad_()
    return x, torch.tensor(cu, dtype=torch.int32, device=device)


def legacy_kl(layer, x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """The selected-keys KL as computed per document and per 256 queries (module docstring)."""
    rows = []
    for xd in x.detach().split(split(cu), dim=1):
        with torch.no_grad():
            q, k, _ = layer._qkv(xd, 0)
        qi, ki, wi = layer._indexer(xd, 0)
        for a in range(0, xd.shape[1], 256):
            b = min(a + 256, xd.shape[1])
            args = (layer, q[:, a:b], k[:, :b], qi[:, a:b], ki[:, :b], wi[:, a:b])
            rows.append(checkpoint(_legacy_rows, *args, use_reentrant=False))
    return torch.cat(rows, dim=1).mean()


def eager_kl(layer, x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """`layer.indexer_loss(x, sparse=True, reduction="mean")` with the KL on the eager form."""
    from lt2dsl.kernels.dsa import dsa_indexer, dsa_indexer_kl

    x = x.detach()
    with torch.no_grad():
        q, k, _ = layer._qkv(x, 0, cu)
    qi, ki, wi = layer._indexer(x, 0, cu)
    sel = dsa_indexer(qi.detach(), ki.detach(), wi.detach(), topk=layer.topk, idx_scale=layer.idx_scale,
                      cu_seqlens=cu, backend=layer.backend, ordered=False)  # fmt: skip
    return dsa_indexer_kl(q, k, qi, ki, wi, idx_scale=layer.idx_scale, indices=sel, cu_seqlens=cu,
                          reduction="mean", backend="reference")  # fmt: skip


def _legacy_rows(layer, q, k, qi, ki, wi) -> torch.Tensor:
    from lt2dsl.kernels.dsa import dsa_indexer

    sel = dsa_indexer(qi.detach(), ki.detach(), wi.detach(), topk=layer.topk, idx_scale=layer.idx_scale,
                      backend=layer.backend)  # fmt: skip
    return dsa_indexer_kl_reference(q, k, qi, ki, wi, idx_scale=layer.idx_scale, indices=sel)


def step_fn(row: str, layer, x: torch.Tensor, cu: torch.Tensor):
    """fwd + bwd of the row's mixer (and KL) under bf16 autocast (fp32 on the CPU)."""
    device = x.device.type
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    params = [p for p in layer.parameters() if p.requires_grad]

    def step():
        for t in [x, *params]:
            t.grad = None
        kl = None
        with torch.autocast(device, dtype=dtype, enabled=device == "cuda"):
            loss = layer(x, None, 0, cu).float().square().mean()
            if row == "dsa+kl-legacy":
                kl = legacy_kl(layer, x, cu)
            elif row == "dsa+kl-eager":
                kl = eager_kl(layer, x, cu)
            elif row.startswith("dsa+kl"):
                kl = layer.indexer_loss(x, 0, sparse=row == "dsa+kl", reduction="mean", cu_seqlens=cu)
            loss = loss if kl is None else loss + kl
        loss.backward()
        return kl

    return step


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(step, device: str, steps: int) -> dict:
    """Median ms of `steps` steps after two warm-up ones, aten ops of one step, peak memory, the KL of
    the last timed step (None for a row without it)."""
    for _ in range(2):
        step()
    sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        kl = step()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    with OpCount() as c:
        step()
    sync(device)
    kl = None if kl is None else kl.item()
    out = {"ms": statistics.median(times), "ms_all": times, "aten_ops": sum(c.n.values()), "peak_gib": peak}
    return out | {"kl": kl}


def estimate_ms(layer, s: dict, device: str) -> float:
    """The cost model's mixer training FLOPs for the row's tokens, at the card's bf16 peak (ms)."""
    from lt2dsl.cost.hardware import load_hardware

    f = layer.spec.flops(layer.opts, layer.cfg, s["seq"], "prefill")
    flops = f.total * (1 + layer.spec.backward_factor(layer.opts)) * s["rows"] * s["seq"]
    return flops / load_hardware("h100" if device == "cuda" else "cpu").peak("bf16") * 1e3


def run(args: argparse.Namespace) -> dict:
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    s = SIZES["smoke" if device == "cpu" else "gpu"]
    x, cu = packed_row(s, device)
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "sizes": s, "rows": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for row in [r for r in args.only.split(",") if r]:
        if row not in ROWS:
            raise SystemExit(f"error: unknown row {row!r}; expected one of {', '.join(ROWS)}")
        torch.manual_seed(0)  # every row's layer has the same weights: the KL rows compare
        layer = mixer(row.split("+")[0], s, device)
        r = measure(step_fn(row, layer, x, cu), device, args.steps)
        r["tok_s"] = x.shape[1] / r["ms"] * 1e3
        r["estimate_ms"] = estimate_ms(layer, s, device)
        out["rows"][row] = r
        kl = "" if r["kl"] is None else f"  KL {r['kl']:.4e}"
        print(
            f"{row:14s} {r['ms']:9.1f} ms  {r['tok_s']:>11,.0f} tok/s  {r['aten_ops']:6d} aten ops  "
            f"peak {r['peak_gib'] or 0:5.2f} GiB  estimate {r['estimate_ms']:6.2f} ms "
            f"({100 * r['estimate_ms'] / r['ms']:.1f}% of it){kl}",
            flush=True,
        )
        tmp = args.out / "dsa_train_step.json.tmp"
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(args.out / "dsa_train_step.json")
        del layer
    return out


if __name__ == "__main__":
    run(args_of())
