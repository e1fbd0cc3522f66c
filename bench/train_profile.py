"""Where a training step's time goes on the GPU: the trainer's step of one of
`bench/train_throughput.py`'s models, kernels by kind and the top kernels, and the card's idle time.

`bench/train_throughput.py` gives a step's wall time (the hybrid's 32k step took 18.7 s on the
H100, MFU 7.1%); this splits it. The trainer (`lt2dsl.train`, the same config as that benchmark:
bf16 over fp32 weights, activation checkpointing where the estimate needs it) runs `--warm` steps,
then `--profiled` steps under the torch profiler (CUPTI's kernel records), timed between two
synchronisations. Per step: kernels by kind (`gemm`, `triton` for lt2dsl's own `@triton.jit`
kernels, `aten`, `other`: count, µs, mean µs), busy = the union of the kernels' intervals, idle =
step − busy, and the top kernels by time, with the share of the step each takes. Results: a table
per point and `<out>/train_profile.json` naming the card.

    python bench/train_profile.py --models hybrid --contexts 8192 --out $OUT/tprof     # on the GPU
    python bench/train_profile.py --smoke --models llama12 --contexts 64 --out /tmp/tprof  # CPU toy
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import train_throughput as tt  # noqa: E402
from bench.decode_profile import show, summarize, triton_kernels  # noqa: E402
from bench.train_peers import free_memory, sync  # noqa: E402
from lt2dsl.train.config import validate  # noqa: E402
from lt2dsl.train.files import atomic_write  # noqa: E402
from lt2dsl.train.loop import Trainer  # noqa: E402
from lt2dsl.train.parallel import Dist  # noqa: E402


class Recorder:
    """`on_step` of the trainer: after `warm` steps it records the next `n` under the profiler,
    timed between two synchronisations, then ends the run."""

    def __init__(self, warm: int, n: int, cuda: bool):
        self.warm, self.n = warm, n
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.prof = profile(activities=activities)
        self.seconds = 0.0
        self._t = 0.0

    def __call__(self, step: int, result) -> bool:
        if step == self.warm:
            sync()
            self.prof.start()
            self._t = time.perf_counter()
        elif step == self.warm + self.n:
            sync()
            self.seconds = time.perf_counter() - self._t
            self.prof.stop()
            return True
        return False


def profile_point(a, name: str, T: int) -> dict:
    cfg = tt.config(a, name, T, a.out)
    cfg["training"]["steps"] = a.warm + a.profiled + 1
    free_memory()
    trainer = Trainer(validate(cfg), Dist(0, 1, torch.device(cfg["training"]["device"])))
    cuda = trainer.d.device.type == "cuda"
    rec = Recorder(a.warm, a.profiled, cuda)
    trainer.fit(False, rec)
    # the kernel modules the model imported, for naming lt2dsl's own kernels
    row = summarize(rec.prof.events(), a.profiled, triton_kernels(), cuda)
    step_us = rec.seconds * 1e6 / a.profiled
    for k in row["top"]:
        k["share"] = k["us"] / step_us
    tokens = trainer.shard.micro * trainer.shard.accum * trainer.data.seq_len
    return row | {
        "model": name,
        "T": T,
        "batch": cfg["training"]["batch_size"],
        "ctx": T,
        "checkpointed": trainer.tm.checkpoint_blocks,
        "step_us": step_us,
        "tok_s": tokens / (step_us / 1e6),
        "idle_us": max(step_us - row["busy_us"], 0.0),
        "source": "trainer steps" if cuda else "CPU: top-level aten ops",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="hybrid", help=f"comma-separated, of {', '.join(tt.MODELS)}")
    p.add_argument("--contexts", default="8192", help="comma-separated sequence lengths")
    p.add_argument("--tokens", type=int, default=None, help="tokens a step (32768; --smoke 256)")
    p.add_argument("--warm", type=int, default=2, help="steps before the profiled ones (compilation)")
    p.add_argument("--profiled", type=int, default=2, help="steps recorded by the profiler")
    p.add_argument("--smoke", action="store_true", help="CPU, toy sizes: the script runs; no claims")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA device (or --smoke for the CPU dry run)", file=sys.stderr)
        return 2
    unknown = [m for m in args.models.split(",") if m not in tt.MODELS]
    if unknown:
        known = ", ".join(tt.MODELS)
        print(f"error: unknown model(s) {', '.join(unknown)}; models: {known}", file=sys.stderr)
        return 2
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out} is a file; expected a folder (created if missing)")
    args.out.mkdir(parents=True, exist_ok=True)
    # the throughput benchmark's settings for everything else (checkpointing threshold, indexer loss)
    a = tt.args_of(["--out", str(args.out), *(["--smoke"] if args.smoke else [])])
    a.tokens = args.tokens or (256 if args.smoke else 32768)
    a.warm, a.profiled = args.warm, args.profiled
    console = Console()
    rows = []
    for name in args.models.split(","):
        for T in map(int, args.contexts.split(",")):
            row = profile_point(a, name, T)
            rows.append(row)
            show(console, f"{name} train step ({row['tok_s']:,.0f} tok/s)", row)
    info = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.smoke else "cpu",
        "torch": torch.__version__,
        "rows": rows,
    }
    atomic_write(args.out / "train_profile.json", json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
