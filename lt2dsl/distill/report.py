"""The report of a distillation run: rich tables for people, `report.json` for machines, PNGs.

* the loss of each stage (first and last logged step, last held-out evaluation) and `losses.png`
  (each stage's curve);
* the layer selection: every replaced block's KL increase, ranked, the kept ones marked, and
  `kl_ranking.png`;
* on the same held-out rows: the next-token loss and perplexity of the teacher, the final student
  and the random-init baseline (trained with the same token budget), and each one's KL to the
  teacher;
* the estimate of the student beside the teacher's (`lt2dsl compile --estimate --vs`), also in
  `estimate.txt`.

The final student is also written as an `LT2ForCausalLM` folder `<out>/student/` when
`report.export_hf` is on and the hf extra is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lt2dsl.distill.evaluate import heldout_batches, kl_to_teacher, lm_loss, perplexity
from lt2dsl.distill.objectives import frozen_teacher
from lt2dsl.distill.teacher import build, load_into, read_weights
from lt2dsl.train.data import DataConfig
from lt2dsl.train.files import atomic_write
from lt2dsl.train.parallel import TrainModel, init_dist
from lt2dsl.train.plot import pyplot, save_figure


def write_report(cfg, teacher, stages: list, baseline) -> dict:
    """Evaluate, write `report.json`, `estimate.txt` and the plots into `training.out`, print the
    tables; returns the report's dict."""
    from lt2dsl.distill.pipeline import train_config

    out, final = cfg.training.out, stages[-1]
    device = init_dist(cfg.training.device).device
    models = {"teacher": frozen_teacher(teacher.model, device), "student": _load(cfg, final, device)}
    if baseline is not None:
        models["baseline"] = _load(cfg, baseline, device)
    vocab = teacher.model.config.vocab
    batches = heldout_batches(train_config(cfg, final.student, out), cfg.report.eval_rows, vocab)
    heldout = {name: {"loss": lm_loss(m, batches)} for name, m in models.items()}
    for name, row in heldout.items():
        row["perplexity"] = perplexity(row["loss"])
        row["kl_to_teacher"] = (
            0.0 if name == "teacher" else kl_to_teacher(models["teacher"], models[name], batches)
        )
    estimate_text, estimate_json = _estimates(cfg, teacher.model.ir, models["student"].ir)
    report = {
        "stages": [_stage_row(s) for s in stages],
        "selection": next((s.selection for s in stages if s.selection), None),
        "heldout": heldout,
        "eval_rows": cfg.report.eval_rows,
        "student": str(final.student),
        "weights": str(final.weights),
        "estimate": estimate_json,
    }
    atomic_write(out / "report.json", json.dumps(report, indent=1))
    atomic_write(out / "estimate.txt", estimate_text)
    if cfg.report.plot:
        plot_losses(stages, out / "losses.png")
        if report["selection"]:
            plot_ranking(report["selection"], out / "kl_ranking.png")
    if cfg.report.export_hf:
        report["hf"] = _export(models["student"], final, out / "student")
    _print(report, estimate_text, cfg.metrics.progress)
    return report


def _load(cfg, stage, device) -> TrainModel:
    model = build(stage.student, cfg.student.backend, str(stage.student))
    load_into(model, read_weights(stage.weights, "weights"), f"the weights of `{stage.folder}`")
    return TrainModel(model.to(device)).eval()


def _stage_row(s) -> dict:
    steps = sorted(s.losses)
    row = {"stage": s.index, "kind": s.kind, "folder": str(s.folder)}
    if steps:
        row |= {"steps": steps[-1], "first_loss": s.losses[steps[0]], "last_loss": s.losses[steps[-1]]}
    if 0 in s.evals:
        row["heldout_start"] = s.evals[0]
    if s.evals and max(s.evals) > 0:
        row["heldout_loss"] = s.evals[max(s.evals)]
    return row


def _estimates(cfg, teacher_ir, student_ir) -> tuple[str, dict]:
    """The student's estimate beside the teacher's at the run's longest row length."""
    from lt2dsl.cost import render
    from lt2dsl.cost.estimate import EstimateOptions, estimate

    seq = cfg.report.estimate_seq or max(
        [s.seq_len for s in cfg.stages if getattr(s, "seq_len", None)]
        + [cfg.data.seq_len if isinstance(cfg.data, DataConfig) else student_ir.config.max_len]
    )
    opts = EstimateOptions(seq=seq)
    entry = render.Entry(
        estimate(student_ir, opts), estimate(teacher_ir, opts), f"teacher {teacher_ir.config.name}"
    )
    return render.to_text([entry]), json.loads(render.to_json([entry]))


# ---- plots ----------------------------------------------------------------------------------------


def plot_losses(stages: list, path: Path) -> Path | None:
    """One panel per training stage: its loss against the step."""
    trained = [s for s in stages if s.losses]
    plt = pyplot()
    if plt is None or not trained:
        return None
    fig, axes = plt.subplots(1, len(trained), figsize=(4 * len(trained), 3.4), squeeze=False)
    for ax, s in zip(axes[0], trained):
        steps = sorted(s.losses)
        ax.plot(steps, [s.losses[k] for k in steps])
        ax.set(title=f"{s.index}. {s.kind}", xlabel="step", ylabel="loss")
    return save_figure(fig, plt, path)


def plot_ranking(selection: dict, path: Path) -> Path | None:
    """The KL increase of each replaced block, largest first, the kept ones highlighted."""
    plt = pyplot()
    if plt is None:
        return None
    ranked = sorted(selection["scores"].items(), key=lambda kv: -kv[1])
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(ranked) + 2), 3.6))
    colors = ["tab:red" if b in selection["chosen"] else "tab:gray" for b, _ in ranked]
    ax.bar(range(len(ranked)), [v for _, v in ranked], color=colors)
    ax.set_xticks(range(len(ranked)), [b for b, _ in ranked], rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="KL increase (nats / token)", title=f"layer selection ({selection['method']}): red = kept")
    return save_figure(fig, plt, path)


# ---- console and export -----------------------------------------------------------------------------


def tables(report: dict) -> list[Table]:
    """The report's rich tables: stages, layer selection, held-out figures."""
    st = Table(title="stages")
    for col in ("stage", "kind", "steps", "first loss", "last loss", "held-out before", "held-out after"):
        st.add_column(col, justify="right" if col != "kind" else "left")
    for r in report["stages"]:
        st.add_row(
            str(r["stage"]),
            r["kind"],
            str(r.get("steps", "")),
            *(_num(r.get(k)) for k in ("first_loss", "last_loss", "heldout_start", "heldout_loss")),
        )
    out = [st]
    if report["selection"]:
        sel = report["selection"]
        t = Table(title=f"layer selection ({sel['method']}, keep {sel['keep']:g})")
        for col in ("rank", "block", "KL increase", "kept"):
            t.add_column(col)
        ranked = sorted(sel["scores"].items(), key=lambda kv: -kv[1])
        for rank, (block, kl) in enumerate(ranked, 1):
            t.add_row(str(rank), block, f"{kl:.4f}", "yes" if block in sel["chosen"] else "")
        out.append(t)
    h = Table(title=f"held-out ({report['eval_rows']} rows)")
    for col in ("model", "loss", "perplexity", "KL to teacher"):
        h.add_column(col, justify="right" if col != "model" else "left")
    for name, row in report["heldout"].items():
        h.add_row(name, f"{row['loss']:.4f}", f"{row['perplexity']:.3f}", f"{row['kl_to_teacher']:.4f}")
    return [*out, h]


def _num(x) -> str:
    return "" if x is None else f"{x:.4f}"


def _print(report: dict, estimate_text: str, show: bool) -> None:
    if not show:
        return
    console = Console(highlight=False, soft_wrap=True)
    for t in tables(report):
        console.print(t)
    console.print(estimate_text, markup=False)


def _export(student: TrainModel, final, folder: Path) -> str | None:
    """`save_pretrained` of the final student (None when the hf extra is missing)."""
    try:
        from lt2dsl.hf import to_hf
    except ModuleNotFoundError:
        return None
    model = build(final.student, "auto", str(final.student))
    load_into(model, read_weights(final.weights, "weights"), "the final weights")
    to_hf(model).save_pretrained(str(folder))
    return str(folder)
