"""Metrics under torchtitan's names: one JSONL row and one console line per log step.

    loss                       mean cross-entropy (nats per labelled token) of the step, all processes
    grad_norm                  global gradient norm before clipping
    tps                        tokens per second per process (every input position counts)
    tflops                     tps × training FLOPs per token (`lt2dsl.cost` estimate) / 1e12
    mfu                        tflops as a percentage of the card's peak (`lt2dsl/cost/hw`, PaLM's MFU)
    data_loading(%)            share of the step time the device waits for its batches: reading
                               them and their copies, as far as the device does not hide them
                               behind the previous step (`train/waits.py`)
    memory/max_reserved(GiB)   peak memory the CUDA allocator reserved (null on the CPU)

A task source that observes (a curriculum) adds `task/accuracy` (the step's exact match) and
`task/stage`; a model with `dsa` layers adds `indexer_loss` (the indexer's mean KL per token and
application, `train/indexer.py`). Evaluation rows carry `eval/loss`, and `eval/perplexity` where
the objective's loss is the next-token cross-entropy (`train/objective.py`). The
training FLOPs per token are the estimate's forward + backward count at `data.seq_len`;
activation recomputation is not counted (MFU counts only the model's own FLOPs).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)
# torch.cuda.get_device_name() substring → `lt2dsl/cost/hw` preset
CARDS = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("B200", "b200"))


class MetricsConfig(BaseModel):
    """Logging, evaluation and the end-of-run plot."""

    model_config = STRICT

    log_interval: int = Field(default=10, gt=0)
    """Steps between metric rows (each one waits for the device once)."""
    eval_interval: int = Field(default=0, ge=0)
    """Steps between held-out evaluations (0: only after the last step)."""
    eval_rows: int = Field(default=64, gt=0)
    """Held-out rows per evaluation (the same rows each time)."""
    progress: bool = True
    """A rich progress bar on a terminal."""
    plot: bool = True
    """Write `metrics.png` (loss and throughput) at the end."""
    hardware: str | None = None
    """Peak FLOP/s for MFU: a `lt2dsl/cost/hw` preset or JSON file; None: from the device's name."""


def peak_flops(device: torch.device, precision: str, hardware: str | None) -> tuple[str, float]:
    """(preset name, dense peak FLOP/s) of the card running this process."""
    from lt2dsl.cost.hardware import load_hardware

    name = hardware
    if name is None and device.type == "cuda":
        card = torch.cuda.get_device_name(device)
        name = next((preset for key, preset in CARDS if key in card), None)
    hw = load_hardware(name or "cpu")
    return hw.name, hw.peak("bf16" if precision == "bf16" else "fp32")


def train_flops_per_token(ir, seq_len: int) -> float:
    """Forward + backward FLOPs per token at `seq_len` (the estimate's `flops_per_token.train`)."""
    from lt2dsl.cost.estimate import EstimateOptions, estimate

    return float(estimate(ir, EstimateOptions(seq=seq_len)).flops_per_token.train)


class Metrics:
    """Writes `metrics.jsonl` and console lines on the main process; keeps every row in `rows`."""

    def __init__(self, cfg: MetricsConfig, out: Path, main: bool, flops: float, peak: float, steps: int):
        self.cfg, self.main, self.flops, self.peak = cfg, main, flops, peak
        self.path = out / "metrics.jsonl"
        self.rows: list[dict] = []
        self.console = Console(highlight=False, soft_wrap=True)
        show = main and cfg.progress and self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not show,
        )
        self.task = self.progress.add_task("train", total=steps, info="")
        self._mark = time.perf_counter()

    def __enter__(self) -> Metrics:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def start_interval(self) -> None:
        self._mark = time.perf_counter()

    def log(
        self, step: int, loss: float, grad_norm: float, lr: float, tokens: int, data_s: float, extra=None
    ) -> dict:
        """A training row for `step`; `tokens` and `data_s` (the device's waits for batches) since the
        previous row; `extra` adds named values (a task's `task/accuracy`, `task/stage`)."""
        now = time.perf_counter()
        elapsed, self._mark = max(now - self._mark, 1e-9), now
        tps = tokens / elapsed
        tflops = tps * self.flops / 1e12
        row = {
            "step": step,
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "tps": tps,
            "tflops": tflops,
            "mfu": 100 * tflops * 1e12 / self.peak,
            "data_loading(%)": 100 * data_s / elapsed,
            "memory/max_reserved(GiB)": _max_reserved(),
            **(extra or {}),
        }
        self._emit(row)
        info = f"loss {loss:.4f}  {tps:,.0f} tok/s  mfu {row['mfu']:.1f}%"
        self.progress.update(self.task, completed=step, info=info)
        return row

    def log_eval(self, step: int, loss: float, perplexity: bool = True) -> dict:
        """The held-out loss at `step`; its exp as `eval/perplexity` only where the loss is the
        next-token cross-entropy (`perplexity`)."""
        row = {"step": step, "eval/loss": loss}
        if perplexity:
            row["eval/perplexity"] = math.exp(min(loss, 700.0))
        self._emit(row)
        return row

    def _emit(self, row: dict) -> None:
        self.rows.append(row)
        if not self.main:
            return
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.console.print(_line(row), markup=False)


def _line(row: dict) -> str:
    if "eval/loss" in row:
        ppl = f"  ppl {row['eval/perplexity']:.2f}" if "eval/perplexity" in row else ""
        return f"step {row['step']:>6}  eval loss {row['eval/loss']:.4f}{ppl}"
    mem = row["memory/max_reserved(GiB)"]
    return (
        f"step {row['step']:>6}  loss {row['loss']:.4f}  grad_norm {row['grad_norm']:.3f}  "
        f"tps {row['tps']:,.0f}  tflops {row['tflops']:.2f}  mfu {row['mfu']:.2f}%  "
        f"data {row['data_loading(%)']:.1f}%"
        + ("" if mem is None else f"  mem {mem:.2f} GiB")
        + "".join(f"  {k} {v:.4g}" for k, v in row.items() if k.startswith("task/") or k == "indexer_loss")
    )


def _max_reserved() -> float | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_reserved() / 2**30
