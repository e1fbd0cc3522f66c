"""`metrics.png`: training and held-out loss, and throughput, against the step (matplotlib, Agg)."""

from __future__ import annotations

import os
from pathlib import Path


def plot_metrics(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """Draw the rows `Metrics` collected; None when matplotlib is missing or there is nothing to draw."""
    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "eval/loss" in r]
    if not train and not evals:
        return None
    plt = pyplot()
    if plt is None:
        return None
    fig, (ax_loss, ax_tps) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
        ax_tps.plot([r["step"] for r in train], [r["tps"] for r in train], color="tab:green")
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["eval/loss"] for r in evals], "o-", label="held-out")
    ax_loss.set(xlabel="step", ylabel="loss (nats / token)", title="loss")
    ax_loss.legend()
    ax_tps.set(xlabel="step", ylabel="tokens / s / process", title="throughput")
    fig.suptitle(title)
    return save_figure(fig, plt, path)


def pyplot():
    """`matplotlib.pyplot` on the Agg backend; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        return None
    return plt


def save_figure(fig, plt, path: Path) -> Path:
    """Lay out `fig`, write it to `path` atomically (a temporary PNG beside it, then a rename), close it."""
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
