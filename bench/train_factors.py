"""Where the trainer's step time and memory go: the gdn12 model trained four ways, fwd + bwd + loss.

Rows (same tokens per step, `--batch` rows of `--seq` tokens, no optimizer):

* `lowered bf16`: `lt2dsl.compile` in bf16 with the fusion passes, full-logits loss (issue 37's
  172k tok/s reference);
* `trainer`: the trainer's forward — fused blocks (`train/fused.py`) on bf16 copies of fp32 master
  weights (`train/precision.py`) and the chunked loss;
* `trainer fused, autocast`: the fused blocks under bf16 autocast over the fp32 weights instead
  (the fused ops then fall back to their reference forms: why the trainer casts its weights);
* `trainer eager, autocast`: the blocks' modules eagerly under autocast (the trainer before fused
  blocks).

Each row: tok/s, the peak memory the CUDA allocator held, and the bytes each way keeps for backward
per token and block application (`lt2dsl.train.saved`, measured at two depths and two lengths)
against the estimate's (`lt2dsl.cost.estimate.block_activations`, 2 bytes an element).

    python bench/train_factors.py --out $OUT/factors              # GPU: the gdn12 model
    python bench/train_factors.py --smoke --out /tmp/factors      # CPU, toy sizes, no claims
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gdn12 import GDN12  # noqa: E402

TOY = (
    GDN12.replace("dim = 1024", "dim = 64")
    .replace("vocab = 32000", "vocab = 512")
    .replace("heads=8, head_dim=128", "heads=2, head_dim=32")
    .replace("hidden=2816", "hidden=128")
)
WAYS = ("lowered bf16", "trainer", "trainer fused, autocast", "trainer eager, autocast")


def args_of(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="CPU, toy sizes: the script runs; no claims")
    return p.parse_args(argv)


def model_of(way: str, src: str, device: torch.device):
    """(the module to call, whether autocast runs around it)."""
    import lt2dsl
    from lt2dsl.train.parallel import TrainModel, WithLoss
    from lt2dsl.train.precision import ParamCast

    lowered = way == "lowered bf16"
    dtype = torch.bfloat16 if lowered else torch.float32
    model = lt2dsl.compile(src, backend="auto", device=device, dtype=dtype, fuse=lowered)
    if lowered:
        return model, False
    tm = TrainModel(model, fuse=way != "trainer eager, autocast")
    if way == "trainer":
        tm.cast = ParamCast(tm, torch.bfloat16)
    return WithLoss(tm, 4096, torch.bfloat16), way != "trainer"


def step_of(way: str, src: str, device: torch.device):
    """fwd + loss + bwd of one way on ids `[B, T + 1]`."""
    module, autocast = model_of(way, src, device)

    def step(ids):
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            if way == "lowered bf16":
                logits = module(ids[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
            else:
                loss = module(ids[:, :-1], ids[:, 1:])
        loss.backward()

    return step


def saved_per_application(way: str, src: str, device: torch.device, lengths: tuple[int, int]) -> float:
    """Bytes kept for backward per token and block application (one and two GDN blocks)."""
    from lt2dsl.train.saved import per_token_application, saved_bytes

    def saved(n: int, T: int) -> int:
        module, autocast = model_of(way, src.replace("* 12", f"* {n}"), device)
        ids = torch.randint(0, 512, (1, T + 1), device=device)

        def forward():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                if way == "lowered bf16":
                    return module(ids[:, :-1])
                return module.tm(ids[:, :-1])

        return saved_bytes(forward)

    return per_token_application(saved, lengths=lengths)


def estimate_per_application(src: str) -> int:
    from lt2dsl.cost.estimate import block_activations
    from lt2dsl.lowering import resolve_source
    from lt2dsl.passes.resolve import blocks

    ir = resolve_source(src, {})
    return 2 * block_activations(blocks(ir.body)[0][0], ir.config)


def measure(step, ids, steps: int) -> dict:
    cuda = ids.device.type == "cuda"
    step(ids)  # warm-up: autotuning, caches
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(ids)
    if cuda:
        torch.cuda.synchronize()
    s = (time.perf_counter() - t0) / steps
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return {"tok_s": ids[:, 1:].numel() / s, "peak_gib": peak}


def row_of(way: str, src: str, ids: torch.Tensor, a) -> dict:
    device = ids.device
    try:  # a way that fails (out of memory) is its row's result
        row = {"way": way, **measure(step_of(way, src, device), ids, 1 if a.smoke else a.steps)}
        lengths = (64, 128) if a.smoke else (1024, 2048)
        row["saved_per_token_app"] = saved_per_application(way, src, device, lengths)
    except Exception as e:
        row = {"way": way, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def table(rows: list[dict], estimate: int, card: str) -> str:
    lines = [f"Card: {card}; the estimate keeps {estimate:,} bytes per token and application", ""]
    lines += ["| way | tok/s | peak GiB | saved B/token/app | vs estimate |", "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['way']} | {r['error']} | | | |")
            continue
        peak = "—" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        saved = r["saved_per_token_app"]
        lines.append(f"| {r['way']} | {r['tok_s']:,.0f} | {peak} | {saved:,.0f} | {saved / estimate:.2f}× |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from lt2dsl.train.files import atomic_write

    a = args_of(argv)
    if not a.smoke and not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA device (or --smoke for the CPU dry run)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if a.smoke else "cuda")
    src, batch, seq = (TOY, 1, 65) if a.smoke else (GDN12, a.batch, a.seq + 1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 512 if a.smoke else 32000, (batch, seq), generator=gen).to(device)
    rows = []
    for way in WAYS:
        rows.append(row_of(way, src, ids, a))
        print(rows[-1], flush=True)
    estimate = estimate_per_application(src)
    card = "cpu (smoke: no claims)" if a.smoke else torch.cuda.get_device_name(device)
    a.out.mkdir(parents=True, exist_ok=True)
    payload = {"card": card, "estimate_per_token_app": estimate, "rows": rows}
    atomic_write(a.out / "train_factors.json", json.dumps(payload, indent=1))
    print(table(rows, estimate, card))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
