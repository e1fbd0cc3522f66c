"""Training throughput on a lent GPU: tokens/s, MFU, the trainer's overhead, peak memory vs the estimate.

For each model and context T, at `--tokens` tokens per step (B = tokens / T rows, one document per
row: the trainer runs them as `[B, T]` without `cu_seqlens`, as the peers do), bf16 over fp32 master
weights, per-application activation checkpointing where the estimate says the model would not fit
without it (`--checkpoint-above`):

* `trainer`: one `lt2dsl.train` `Trainer` (fused blocks, the default) on a synthetic token file —
  two warm-up steps (kernel compilation), then `--rounds` windows of steps sized to `--window-s`
  seconds, each timed between two device synchronisations, the median reported; the peak memory
  the CUDA allocator held in those windows against the trainer's own estimate
  (`lt2dsl.cost.train_memory`); one checkpoint save per model as the trainer makes it (a host copy
  in the step, the files from a thread), what the step waits for amortised over `--ckpt-interval`;
* `bare`: after each trainer window, as many steps of the same trainer's model, loss and optimizer
  on pre-read batches in a plain loop (forward and chunked loss, backward, clip, AdamW step):
  `overhead` = 1 − median bare / median trainer step is what the trainer adds (data, logging,
  bookkeeping), from pairs adjacent in time (per-round values in the JSON); skipped where the warm
  step took longer than `--bare-max-step-s`;
* `hf`: transformers' `LlamaForCausalLM` of the same shape in the same plain loop (llama rows),
  gradient checkpointing where the trainer checkpoints;
* `fla`: fla's `GatedDeltaNetForCausalLM` of the peer's shape where fla imports (gdn12 rows).

`llama12` is lt2dsl's full-attention model of the gdn12 shape (12 layers, dim 1024, 8 heads of 128,
SwiGLU 2816): HF Llama's architecture, which `hf` trains as transformers writes it. The hybrid's DSA
indexer loss is off (`--indexer-loss 0`, indexers frozen) unless asked for: its eager chunks are not
in the estimate's FLOPs and have their own benchmark (`bench/dsa_train_step.py`). MFU = tok/s × the
estimate's training FLOPs per token / the card's dense bf16 peak (`lt2dsl/cost/hw`), for every
implementation alike. `--budget-s` skips the rows that would start after that many seconds.
Results: `<out>/train_throughput.{json,md}`, the table printed last, the card named in both.

    python bench/train_throughput.py --out $OUT/train --budget-s 400     # on the GPU
    python bench/train_throughput.py --smoke --out /tmp/train_bench --contexts 256,512  # CPU, toy
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gdn12 import GDN12  # noqa: E402
from bench.train_peers import bare_loop, fla_gdn, free_memory, hf_llama, measure_peer, peak_gib, sync  # noqa: E402
from lt2dsl.train import checkpoint as ckpt  # noqa: E402
from lt2dsl.train.config import validate  # noqa: E402
from lt2dsl.train.files import atomic_write  # noqa: E402
from lt2dsl.train.loop import Trainer  # noqa: E402
from lt2dsl.train.metrics import peak_flops, train_flops_per_token  # noqa: E402
from lt2dsl.train.parallel import Dist  # noqa: E402

# gdn12's shape with full attention: HF Llama's architecture (`hf` trains transformers' own)
LLAMA12 = """model llama12 {
  dim = 1024
  vocab = 32000
  heads = 8
  head_dim = 128
  tie_embeddings = true
  mlp = swiglu(hidden=2816)
  full * 12
}
"""
MODELS = {
    "gdn12": {"text": GDN12, "hf": None, "fla": True},
    "hybrid": {"file": ROOT / "examples" / "lt2_hybrid_gdn_dsa.lt2", "hf": None, "fla": False},
    "llama12": {"text": LLAMA12, "hf": "llama", "fla": False},
    "llama1b": {"file": ROOT / "examples" / "llama_baseline.lt2", "hf": "llama", "fla": False},
}
TOY = {"dim": 64, "vocab": 512, "heads": 2, "kv_heads": 1, "head_dim": 32, "mlp": "swiglu(hidden=128)"}
WARM = 2  # trainer steps before the window: kernel compilation, allocator growth


def args_of(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", default="gdn12,hybrid,llama12")
    p.add_argument("--contexts", default="32768,8192,2048")
    p.add_argument("--tokens", type=int, default=None, help="tokens a step (32768; --smoke 1024)")
    p.add_argument("--window-s", type=float, default=3.0, help="seconds of each timed window (≥ 2 steps)")
    p.add_argument("--max-steps", type=int, default=30, help="most steps of a timed window")
    p.add_argument("--rounds", type=int, default=3, help="timed windows, each followed by a plain-loop one")
    p.add_argument("--ckpt-interval", type=int, default=500, help="steps a checkpoint save is amortised over")
    p.add_argument(
        "--checkpoint-above",
        type=float,
        default=0.7,
        help="checkpoint activations when the estimate without exceeds this fraction of the card's memory",
    )
    p.add_argument(
        "--bare-max-step-s",
        type=float,
        default=2.0,
        help="skip the bare loop where a trainer step takes longer (its overhead is then a rounding error)",
    )
    p.add_argument("--indexer-loss", type=float, default=0.0, help="training.indexer_loss of dsa models")
    p.add_argument(
        "--checkpoint-keep",
        default="attention",
        help="training.checkpoint_keep of checkpointed rows, comma-separated ('' recomputes everything)",
    )
    p.add_argument(
        "--dsa-dkdv",
        choices=("atomic", "by_key", "auto"),
        default=None,
        help="the form of DSA's dK/dV in the model's backward (default: the kernels' DEFAULT_DKDV)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile every block")
    p.add_argument("--budget-s", type=float, default=None, help="start no row after this many seconds")
    p.add_argument("--smoke", action="store_true", help="CPU, toy sizes: the script runs; no claims")
    a = p.parse_args(argv)
    if a.tokens is None:
        a.tokens = 1024 if a.smoke else 32768
    return a


# ---- the run's inputs -----------------------------------------------------------------------------


def model_file(name: str, out: Path) -> Path:
    spec = MODELS[name]
    if "file" in spec:
        return spec["file"]
    path = out / f"{name}.lt2"
    path.write_text(spec["text"])
    return path


def token_file(out: Path, vocab: int, n_tokens: int, doc: int) -> Path:
    """A prepared token folder of random ids (`data.tokens`), one document every `doc` tokens."""
    folder = out / "tokens" / f"v{vocab}-n{n_tokens}-d{doc}"
    if (folder / "meta.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    meta = {"vocab_size": vocab, "tokenizer": "random"}
    for split, n in (("train", n_tokens), ("val", 4 * doc + 1)):
        rng.integers(0, vocab, n, dtype=np.int64).astype(dtype).tofile(folder / f"{split}.bin")
        np.arange(0, n, doc, dtype=np.int64).tofile(folder / f"{split}.docs.bin")
        meta[split] = {"dtype": np.dtype(dtype).name, "tokens": n, "documents": -(-n // doc)}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def resolved(name: str, smoke: bool, out: Path):
    """The resolved model (its settings size the token file and the peers' twins)."""
    from lt2dsl.lowering import resolve_source

    return resolve_source(model_file(name, out), dict(TOY) if smoke else {})


def needs_checkpointing(a, ir, rows: int, T: int) -> bool:
    """Whether the estimate without activation checkpointing exceeds `--checkpoint-above` of the card."""
    from lt2dsl.cost.train_memory import train_memory

    if a.smoke:
        return False
    card = torch.cuda.get_device_properties(0).total_memory
    return train_memory(ir, rows, T).total(False) > a.checkpoint_above * card


def config(a, name: str, T: int, out: Path) -> dict:
    rows = max(1, a.tokens // T)
    ir = resolved(name, a.smoke, out)
    steps = WARM + a.rounds * a.max_steps + 1  # the last window ends before the last step (its evaluation)
    folder = token_file(out, ir.config.vocab, (steps + 4) * rows * T + 1, doc=T)
    return {
        "model": {"file": str(model_file(name, out)), "set": dict(TOY) if a.smoke else {}, "backend": "auto"},
        "data": {"tokens": str(folder), "seq_len": T},
        "training": {
            "steps": steps,
            "batch_size": rows,
            "precision": "fp32" if a.smoke else "bf16",
            "activation_checkpoint": "per_application" if needs_checkpointing(a, ir, rows, T) else "none",
            "checkpoint_keep": [k for k in a.checkpoint_keep.split(",") if k],
            "compile": a.compile,
            "indexer_loss": a.indexer_loss,
            "out": str(out / f"{name}-{T}"),
            "device": "cpu" if a.smoke else "cuda",
        },
        "checkpoint": {"enable": False},
        "metrics": {"log_interval": 10, "eval_interval": 0, "eval_rows": 1, "progress": False, "plot": False},
    }


# ---- measurements ---------------------------------------------------------------------------------


class Window:
    """`on_step` of the trainer: after `WARM` steps (the last one timed, to size the windows) it
    times `rounds` windows of `n` steps, each between two synchronisations; after each, `bare(n)`
    (if given) times the same number of plain-loop steps on the same model, so the two are paired
    in time (clocks, allocator state) and the overhead is not a difference of two distant windows.
    The run ends after the last round. No plain loop where the timed warm step took longer than
    `bare_max_s` (the trainer's few host-side milliseconds are then a rounding error)."""

    def __init__(self, window_s: float, max_steps: int, rounds: int, bare=None, bare_max_s: float = math.inf):
        self.window_s, self.max_steps, self.rounds, self.bare = window_s, max_steps, rounds, bare
        self.bare_max_s = bare_max_s
        self.n = 0
        self.trainer_s: list[float] = []  # seconds a step, per round
        self.bare_s: list[float] = []
        self.peak: float | None = None
        self._t = 0.0
        self._end = 0

    def __call__(self, step: int, result) -> bool:
        if step not in (WARM - 1, WARM, self._end):
            return False  # no wait inside a window: the host runs ahead as in any training
        sync()
        now = time.perf_counter()
        if step == WARM - 1:
            self._t = now
        elif step == WARM:
            warm_s = now - self._t
            self.n = max(2, min(self.max_steps, math.ceil(self.window_s / max(warm_s, 1e-9))))
            if warm_s > self.bare_max_s:
                self.bare = None
            self._begin(WARM)
        elif step == self._end:
            self.trainer_s.append((now - self._t) / self.n)
            self.peak = max(self.peak or 0.0, peak_gib() or 0.0) if torch.cuda.is_available() else None
            if self.bare is not None:
                self.bare_s.append(self.bare(self.n))
            if len(self.trainer_s) == self.rounds:
                return True
            self._begin(step)
        return False

    def _begin(self, step: int) -> None:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        sync()
        self._t, self._end = time.perf_counter(), step + self.n


def bare_steps(trainer: Trainer):
    """`f(n)`: seconds a step of the trainer's own model, loss and optimizer in a plain loop over
    two pre-read batches (forward and chunked loss, backward, clip, AdamW step), n steps."""
    device = trainer.d.device
    batches = [[b.to(device) for b in trainer.data.train.next_step()] for _ in range(2)]
    params = [p for p in trainer.tm.parameters() if p.requires_grad]

    def step(micro):
        for b in micro:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=trainer.autocast):
                loss = trainer.fwd(b.input_ids, b.labels, b.cu_seqlens)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        trainer.opt.step()
        trainer.opt.zero_grad(set_to_none=True)

    return lambda n: bare_loop(step, batches, n, warm=0)


def measure_trainer(trainer: Trainer, a) -> tuple[dict, dict | None]:
    """(the trainer's tok/s, its median step over the rounds, peak memory against its estimate;
    the paired plain loop's, or None where a step is longer than `--bare-max-step-s`)."""
    bare_max = math.inf if a.smoke else a.bare_max_step_s
    window = Window(a.window_s, a.max_steps, a.rounds, bare_steps(trainer), bare_max)
    trainer.fit(False, window)
    est = json.loads((trainer.out / "estimate.json").read_text())["memory_bytes"]
    checkpointed = trainer.tm.checkpoint_blocks
    tokens = trainer.shard.micro * trainer.shard.accum * trainer.data.seq_len
    step_s = statistics.median(window.trainer_s)
    row = {
        "tok_s": tokens / step_s,
        "step_s": step_s,
        "steps": window.n,
        "rounds": window.trainer_s,
        "checkpointed": checkpointed,
        "peak_gib": window.peak,
        "estimate_gib": est["total_checkpointed" if checkpointed else "total"] / 2**30,
    }
    if not window.bare_s:
        return row, None
    bare_s = statistics.median(window.bare_s)
    # each round's own pair, for the spread; the headline is the medians'
    row["overhead_rounds"] = [100 * (1 - b / t) for t, b in zip(window.trainer_s, window.bare_s)]
    row["overhead_pct"] = 100 * (1 - bare_s / step_s)
    bare = {"tok_s": tokens / bare_s, "step_s": bare_s, "steps": window.n, "rounds": window.bare_s}
    return row, bare


def measure_checkpoint(trainer: Trainer) -> tuple[float, float]:
    """(seconds the training waits for one checkpoint save of the trainer, seconds until its
    files are written): the save as the trainer makes it (`checkpoint.async_save`: a host copy in
    the step, the files from a thread); the files go."""
    folder = trainer.out / "ckpt_probe"
    saver = ckpt.Saver(folder, trainer.d, keep=0, background=trainer.cfg.checkpoint.async_save)
    sync()
    t0 = time.perf_counter()
    saver.save(1, 0, trainer.state)
    sync()
    blocking = time.perf_counter() - t0
    saver.wait()
    written = time.perf_counter() - t0
    shutil.rmtree(folder, ignore_errors=True)
    return blocking, written


# ---- the table ------------------------------------------------------------------------------------


def rows_for(a, name: str, T: int, out: Path, hw: tuple[str, float], save_s: dict) -> list[dict]:
    cfg = config(a, name, T, out)
    ir = resolved(name, a.smoke, out)
    flops = train_flops_per_token(ir, T)
    base = {"model": name, "T": T, "B": cfg["training"]["batch_size"], "flops_per_token": flops}
    free_memory()
    try:
        trainer = Trainer(validate(cfg), Dist(0, 1, torch.device(cfg["training"]["device"])))
        row, bare = measure_trainer(trainer, a)
    except torch.OutOfMemoryError:
        return [{**base, "impl": "trainer", "note": "OOM"}]
    if name not in save_s:  # the checkpoint's size does not depend on the context
        save_s[name] = measure_checkpoint(trainer)
    row["ckpt_wait_s"], row["ckpt_write_s"] = save_s[name]
    row["ckpt_pct"] = 100 * row["ckpt_wait_s"] / (a.ckpt_interval * row["step_s"])
    if bare is None:
        row["note"] = f"no bare loop: step > {a.bare_max_step_s:g} s"
    out_rows = [{**base, "impl": "trainer", **row}]
    if bare is not None:
        out_rows.append({**base, "impl": "bare", **bare})
    del trainer
    free_memory()
    peers = {
        "hf": hf_llama(ir) if MODELS[name]["hf"] else None,
        "fla": fla_gdn(ir) if MODELS[name]["fla"] else None,
    }
    peer_steps = max(2, row["steps"] * a.rounds)  # as many as the trainer's timed steps
    for impl, model in peers.items():
        if model is not None:
            out_rows.append({**base, "impl": impl, **measure_peer(model, cfg, a, peer_steps)})
            del model
    for r in out_rows:
        if r.get("tok_s"):
            r["mfu"] = 100 * r["tok_s"] * flops / hw[1]
    trainer = out_rows[0]
    # issue 37's bars: what the trainer adds (data, logging, its saves) and the memory estimate
    if "overhead_pct" in trainer:
        trainer["added_pct"] = trainer["overhead_pct"] + trainer["ckpt_pct"]
    if trainer.get("peak_gib") and trainer.get("estimate_gib"):
        trainer["peak_vs_estimate"] = trainer["peak_gib"] / trainer["estimate_gib"]
    return out_rows


COLUMNS = (
    ("tok_s", "tok/s", ",.0f"),
    ("mfu", "MFU %", ".1f"),
    ("overhead_pct", "overhead %", ".1f"),
    ("ckpt_pct", "ckpt %", ".2f"),
    ("added_pct", "added % (bar 3)", ".1f"),
    ("peak_gib", "peak GiB", ".2f"),
    ("estimate_gib", "estimate GiB", ".2f"),
    ("peak_vs_estimate", "peak / estimate", ".2f"),
)


def markdown(rows: list[dict], card: str) -> str:
    head = "| model | T | B | impl | " + " | ".join(title for _, title, _ in COLUMNS) + " | note |"
    lines = [f"Card: {card}", "", head, "|" + "---|" * (5 + len(COLUMNS))]

    def f(x, fmt):
        return "—" if x is None else format(x, fmt)

    for r in rows:
        note = "; ".join(n for n in ("checkpointed" if r.get("checkpointed") else "", r.get("note", "")) if n)
        cells = [str(r.get(k, "—")) for k in ("model", "T", "B", "impl")]
        cells += [f(r.get(k), fmt) for k, _, fmt in COLUMNS]
        lines.append("| " + " | ".join([*cells, note]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = args_of(argv)
    if not a.smoke and not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA device (or --smoke for the CPU dry run)", file=sys.stderr)
        return 2
    unknown = [m for m in a.models.split(",") if m not in MODELS]
    if unknown:
        print(f"error: unknown model(s) {', '.join(unknown)}; models: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    if a.dsa_dkdv is not None:
        from lt2dsl.kernels.dsa import triton_attn

        triton_attn.DEFAULT_DKDV = a.dsa_dkdv  # every DSA backward of this process
    start = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if a.smoke else "cuda")
    card = "cpu (smoke: no claims)" if a.smoke else torch.cuda.get_device_name(device)
    hw = peak_flops(device, "fp32" if a.smoke else "bf16", None)
    rows: list[dict] = []
    save_s: dict[str, float] = {}
    # contexts outermost: a run cut by --budget-s still compares every model at the first contexts
    for T in (int(t) for t in a.contexts.split(",")):
        for name in a.models.split(","):
            if a.budget_s is not None and time.monotonic() - start > a.budget_s:
                rows.append({"model": name, "T": T, "impl": "trainer", "note": "skipped: --budget-s"})
                continue
            t0 = time.monotonic()
            new = rows_for(a, name, T, a.out, hw, save_s)
            print(f"{name} T={T}: {time.monotonic() - t0:.0f} s", flush=True)
            rows += new
            payload = {
                "card": card,
                "peak": hw,
                "args": {k: str(v) for k, v in vars(a).items()},
                "rows": rows,
            }
            atomic_write(a.out / "train_throughput.json", json.dumps(payload, indent=1))
    table = markdown(rows, card)
    atomic_write(a.out / "train_throughput.md", table + "\n")
    print(table)
    print(f"total {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
