"""Where the trainer's step time and memory go: one model trained five ways, fwd + bwd + loss.

Rows (same tokens per step, `--batch` rows of `--seq` tokens, no optimizer):

* `graph bf16 fused`: `lt2dsl.compile` in bf16 with the fusion passes, full-logits loss (issue 37's
  172k tok/s reference);
* `graph bf16 unfused`: the same without fusion;
* `graph fp32+autocast fused` / `unfused`: fp32 weights under bf16 autocast;
* `trainer path`: `TrainModel` + `WithLoss` (the eager blocks and the chunked loss `lt2dsl.train`
  runs) under bf16 autocast over fp32 weights.

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
    .replace("* 12", "* 2")
)


def args_of(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="CPU, toy sizes: the script runs; no claims")
    return p.parse_args(argv)


def graph_step(model, autocast: bool):
    def step(ids):
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids)
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()

    return step


def trainer_step(model):
    from lt2dsl.train.parallel import TrainModel, WithLoss

    fwd = WithLoss(TrainModel(model), 4096, torch.bfloat16)

    def step(ids):
        with torch.autocast(ids.device.type, dtype=torch.bfloat16):
            loss = fwd(ids[:, :-1], ids[:, 1:])
        loss.backward()

    return step


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


def main(argv=None) -> int:
    import lt2dsl

    a = args_of(argv)
    if not a.smoke and not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA device (or --smoke for the CPU dry run)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if a.smoke else "cuda")
    src, batch, seq = (TOY, 1, 65) if a.smoke else (GDN12, a.batch, a.seq + 1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 512 if a.smoke else 32000, (batch, seq), generator=gen).to(device)
    ways = [
        ("graph bf16 fused", torch.bfloat16, True, False),
        ("graph bf16 unfused", torch.bfloat16, False, False),
        ("graph fp32+autocast fused", torch.float32, True, True),
        ("graph fp32+autocast unfused", torch.float32, False, True),
        ("trainer path", torch.float32, False, None),
    ]
    rows = []
    for name, dtype, fuse, autocast in ways:
        try:  # a way that fails (out of memory, a kernel refusing fp32 weights) is its row's result
            model = lt2dsl.compile(src, backend="auto", device=device, dtype=dtype, fuse=fuse)
            step = trainer_step(model) if autocast is None else graph_step(model, autocast)
            rows.append({"way": name, **measure(step, ids, 1 if a.smoke else a.steps)})
        except Exception as e:
            rows.append({"way": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        print(rows[-1], flush=True)
        model = step = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    a.out.mkdir(parents=True, exist_ok=True)
    card = "cpu (smoke: no claims)" if a.smoke else torch.cuda.get_device_name(device)
    (a.out / "train_factors.json").write_text(json.dumps({"card": card, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
