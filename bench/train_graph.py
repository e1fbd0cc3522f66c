"""Steps/s and tokens/s of one task-experiment training with and without `training.cuda_graph`.

One (run, data entry) of an experiment file (`examples/experiments/*.toml`) trains `--steps` steps
twice, the same seed, eager and with the step captured (`lt2dsl/train/graph.py`); the window timed
is steps `--skip` + 1 to the last, between two device synchronisations (the first steps warm up
Triton and, with the flag, capture). Both trainings' losses are reported, so a reader sees they
agree within bf16 noise. Results: a table, and `<out>/train_graph.json` naming the card.

    python bench/train_graph.py examples/experiments/a_state_tracking.toml --run "full T=4" \\
        --data s5 --steps 300 --out $OUT/graph                            # on the GPU
    python bench/train_graph.py examples/experiments/b_recall.toml --steps 8 --skip 2 \\
        --device cpu --out /tmp/graph_bench                               # CPU: no capture, no claims
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from lt2dsl.tasks.experiment_config import load_experiment, train_config
from lt2dsl.train.files import atomic_write
from lt2dsl.train.loop import Trainer
from lt2dsl.train.parallel import init_dist


def pick(items, name: str | None, what: str):
    """The item called `name`, or the first; ValueError listing the names."""
    if name is None:
        return items[0]
    for item in items:
        if item.name == name:
            return item
    raise ValueError(f"no {what} named {name!r}; there are: {', '.join(i.name for i in items)}")


def train_once(args, graph: bool) -> dict:
    exp, root = load_experiment(args.experiment)
    entry = pick(exp.runs, args.run, "run"), pick(exp.data, args.data, "data entry")
    with tempfile.TemporaryDirectory() as work:
        cfg = train_config(exp, *entry, args.seed, root, args.device, Path(work))
        cfg.training.steps, cfg.training.cuda_graph = args.steps, graph
        cfg.metrics.log_interval = args.steps
        marks: dict[int, tuple[float, int]] = {}
        trainer = Trainer(cfg, init_dist(args.device))

        def on_step(step: int, _) -> None:
            if step in (args.skip, args.steps):
                if args.device == "cuda":
                    torch.cuda.synchronize()
                marks[step] = time.perf_counter(), trainer.tokens_seen

        result = trainer.fit(False, on_step)
    seconds = marks[args.steps][0] - marks[args.skip][0]
    tokens = marks[args.steps][1] - marks[args.skip][1]
    steps = args.steps - args.skip
    return {
        "cuda_graph": graph,
        "run": entry[0].name,
        "data": entry[1].name,
        "steps_timed": steps,
        "steps_per_s": steps / seconds,
        "tokens_per_s": tokens / seconds,
        "loss_first": result.losses[1],
        "loss_last": result.losses[args.steps],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", type=Path)
    ap.add_argument("--run", help="the run's name (default: the first)")
    ap.add_argument("--data", help="the data entry's name (default: the first)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--skip", type=int, default=20, help="steps before the timed window")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not 0 < args.skip < args.steps:
        ap.error("--skip must lie between 0 and --steps")
    rows = [train_once(args, graph) for graph in (False, True)]
    card = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    table = Table(title=f"{args.experiment.name} on {card}")
    for key in rows[0]:
        table.add_column(key)
    for r in rows:
        table.add_row(*(f"{v:,.4g}" if isinstance(v, float) else str(v) for v in r.values()))
    Console().print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    speedup = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    Console().print(f"cuda_graph: {speedup:.2f}x the eager tokens/s")
    out = {"card": card, "torch": torch.__version__, "rows": rows, "speedup": speedup}
    atomic_write(args.out / "train_graph.json", json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
