"""Distillation on a lent GPU: a ~100M-parameter Llama-style teacher, three students, their baselines.

In one process, in bf16 (fp32 master weights), over a byte-level corpus of the Python standard
library's sources (present on every machine; one document per file, 2% held out):

1. the teacher (`full * 12`, dim 768, GQA 12/4 heads, SwiGLU 2816: 97M parameters) is trained by
   `lt2dsl train` for a fixed token budget;
2. `lt2dsl.distill.run` distils it, with a fixed smaller budget each, into
   * `gdn`: every attention a GDN (`align`, then `kd`),
   * `gdn+dsa`: GDN and DSA alternating (`align`, then `kd`),
   * `full+gdn`: the GDN student with 25% of its blocks kept as attention by KL-guided selection
     (`align`, `select`, `kd`);
   each run also trains a randomly initialised student of its final program with the plain
   next-token loss on as many tokens (`report.baseline`);
3. every figure is a held-out mean over the same rows (the distillation report's), and the decode
   speed of each final program at 8k context, batch 1, comes from `lt2dsl.engine.bench` (decode
   speed depends on the program, not on its weights).

Results: `<out>/distill_gpu.json` (written after every phase, so a run cut short keeps what it
measured), `<out>/distill_gpu.md` (the table) and the selection's `kl_ranking.png`. Each phase's
wall time is recorded, to scale `--scale` for another card.

    python bench/distill_gpu.py --out "$OUT"                    # one H100, sized for a 10-minute call
    python bench/distill_gpu.py --tiny --out /tmp/distill_gpu   # CPU, toy sizes: it runs; no claims
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lt2dsl.distill import run as distill  # noqa: E402
from lt2dsl.train import run as train  # noqa: E402

# shapes and budgets (steps of `batch` rows of `seq` tokens)
SIZES = {
    "gpu": {
        "dim": 768, "layers": 12, "heads": 12, "kv_heads": 4, "head_dim": 64, "hidden": 2816,
        "seq": 1024, "batch": 32, "teacher_steps": 800, "align_steps": 15, "kd_steps": 45,
        "lr": 1e-3, "teacher_lr": 2e-3, "topk": 256, "eval_rows": 64, "decode_ctx": 8192,
        "precision": "bf16", "corpus_mb": 40, "backend": "auto",
    },
    "tiny": {
        "dim": 32, "layers": 4, "heads": 2, "kv_heads": 1, "head_dim": 16, "hidden": 64,
        "seq": 64, "batch": 8, "teacher_steps": 40, "align_steps": 4, "kd_steps": 4,
        "lr": 3e-3, "teacher_lr": 1e-2, "topk": 16, "eval_rows": 8, "decode_ctx": 64,
        "precision": "fp32", "corpus_mb": 0.2, "backend": "reference",
    },
}  # fmt: skip
HEAD = """model {name} {{
  dim = {dim}
  vocab = 256
  heads = {heads}
  kv_heads = {kv_heads}
  head_dim = {head_dim}
  mlp = swiglu(hidden={hidden})
  max_len = 16k
  {body}
}}
"""


def args_of(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="where the JSON, table and PNG go")
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="run folders and the corpus (new or empty) [a temporary folder]",
    )
    p.add_argument("--scale", type=float, default=1.0, help="multiply every step budget")
    p.add_argument("--students", default="gdn,full+gdn,gdn+dsa", help="in this order [%(default)s]")
    p.add_argument("--tiny", action="store_true", help="CPU, toy sizes: the script runs; no claims")
    return p.parse_args(argv)


def bodies(s: dict) -> dict[str, str]:
    """The `.lt2` body of the teacher and of each student program."""
    n, gdn = s["layers"], "gdn(expand_v=1)"
    dsa = f"dsa(topk={s['topk']}, index_heads={s['kv_heads']}, index_dim={s['head_dim']})"
    return {
        "teacher": f"full * {n}",
        "gdn": f"{gdn} * {n}",
        "gdn+dsa": f"repeat {n // 2} < {gdn}; {dsa} >",
        "full+gdn": f"{gdn} * {n}",
    }


def write_programs(s: dict, work: Path) -> dict[str, Path]:
    paths = {}
    for name, body in bodies(s).items():
        ident = name.replace("+", "_")
        paths[name] = work / f"{ident}.lt2"
        paths[name].write_text(HEAD.format(name=ident, body=body, **s))
    return paths


def corpus(work: Path, megabytes: float) -> Path:
    """The standard library's `.py` files (sorted, up to `megabytes`) as JSONL, one document each."""
    path = work / "stdlib.jsonl"
    if path.is_file():
        return path
    budget, rows = int(megabytes * 2**20), []
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in f.parts or budget <= 0:
            continue
        text = f.read_text(encoding="utf-8", errors="replace")
        rows.append(json.dumps({"text": text}))
        budget -= len(text)
    path.write_text("\n".join(rows) + "\n")
    return path


def sections(s: dict, work: Path, text: Path) -> dict:
    """The trainer sections every run shares."""
    return {
        "data": {
            "train": [str(text)],
            "val_fraction": 0.02,
            "seq_len": s["seq"],
            "cache": str(work / "data"),
        },
        "optimizer": {"lr": s["lr"], "weight_decay": 0.0},
        "scheduler": {"warmup_steps": 10},
        "checkpoint": {"enable": False},
        "metrics": {"log_interval": 10, "eval_rows": s["eval_rows"], "progress": False, "plot": False},
    }


def teacher_run(s: dict, work: Path, program: Path, shared: dict, steps: int) -> Path:
    out = work / "teacher"
    cfg = shared | {
        "model": {"file": str(program), "backend": s["backend"]},
        "training": {"steps": steps, "batch_size": s["batch"], "precision": s["precision"], "out": str(out)},
        "optimizer": {"lr": s["teacher_lr"], "weight_decay": 0.0},
        "checkpoint": {"enable": True, "interval": steps},
    }
    train(cfg)
    return out


def student_run(s: dict, work: Path, name: str, programs: dict, teacher: Path, shared: dict, k: float):
    stages = [{"kind": "align", "steps": steps(s["align_steps"], k)}]
    if name == "full+gdn":
        stages.append({"kind": "select", "keep": 0.25})
    stages.append({"kind": "kd", "steps": steps(s["kd_steps"], k)})
    cfg = shared | {
        "teacher": {"file": str(programs["teacher"]), "weights": str(teacher), "backend": s["backend"]},
        "student": {"file": str(programs[name]), "backend": s["backend"]},
        "training": {
            "batch_size": s["batch"],
            "precision": s["precision"],
            "out": str(work / name),
            "seed": 0,
        },
        "stages": stages,
        "report": {"baseline": True, "eval_rows": s["eval_rows"], "export_hf": False, "plot": True},
    }
    return distill(cfg)


def steps(base: int, k: float) -> int:
    return max(1, round(base * k))


def decode_speed(program: Path, ctx: int) -> dict:
    """Decode tokens/s at `ctx` context, batch 1 (`lt2dsl.engine.bench`), with the estimate's."""
    from lt2dsl import compile as compile_lt2
    from lt2dsl.cost.hardware import load_hardware
    from lt2dsl.engine import bench
    from lt2dsl.engine.cli import CARDS

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model = compile_lt2(program, device=device, dtype=torch.bfloat16 if cuda else torch.float32).eval()
    card = bench.device_name(device)
    hw = load_hardware(next((v for k, v in CARDS.items() if k in card), "h100" if cuda else "cpu"))
    plan = bench.Plan(contexts=(ctx,), batches=(1,), steps=32 if cuda else 4, warm=4 if cuda else 1, hw=hw)
    (row,) = bench.run([(program.stem, model)], plan)
    del model
    if cuda:
        torch.cuda.empty_cache()
    return {k: row.get(k) for k in ("tok_s", "estimate_tok_s", "step_ms", "first_s", "oom")}


def params(program: Path) -> int:
    """The program's parameter count (built on the meta device: nothing allocated)."""
    from lt2dsl import compile as compile_lt2

    return sum(p.numel() for p in compile_lt2(program, device="meta", fuse=False).parameters())


def rows_of(result: dict) -> list[dict]:
    """One table row per model: the teacher, each student, each random-init student."""
    rows = []
    for name, r in result["students"].items():
        held = r["heldout"]
        if not rows:
            rows.append({"model": "teacher", **held["teacher"], **result["teacher"]})
        rows.append({"model": name, **held["student"], **r["decode"], "params": r["params"]})
        rows.append({"model": f"{name} (random init)", **held["baseline"], "params": r["params"]})
    return rows


def teacher_leads(result: dict) -> dict[str, bool]:
    """Per student: whether the teacher's held-out loss is below its random-init twin's. Where it is
    not, the teacher knows less than the student's own budget teaches from scratch, and the
    comparison says nothing about distillation (the teacher is undertrained for that budget)."""
    return {
        name: r["heldout"]["teacher"]["loss"] < r["heldout"]["baseline"]["loss"]
        for name, r in result["students"].items()
    }


def student_leads(result: dict) -> dict[str, bool]:
    """Per student: whether distillation paid, its held-out loss below its random-init twin's
    (the same program trained on as many tokens with the plain next-token loss)."""
    return {
        name: r["heldout"]["student"]["loss"] < r["heldout"]["baseline"]["loss"]
        for name, r in result["students"].items()
    }


def table(result: dict) -> str:
    cols = (
        "model",
        "params (M)",
        "held-out loss",
        "perplexity",
        "KL to teacher",
        "decode tok/s",
        "estimate tok/s",
    )
    out = [f"device: {result['device']}, decode at {result['decode_ctx']} tokens of context, batch 1", ""]
    out += ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    for r in rows_of(result):
        cells = [r["model"], f"{r['params'] / 1e6:.2f}", f"{r['loss']:.4f}", f"{r['perplexity']:.3f}"]
        cells += [f"{r['kl_to_teacher']:.4f}", _fmt(r.get("tok_s")), _fmt(r.get("estimate_tok_s"))]
        out.append("| " + " | ".join(cells) + " |")
    lead = teacher_leads(result)
    if lead and not all(lead.values()):
        behind = ", ".join(name for name, ok in lead.items() if not ok)
        out += ["", f"VOID for {behind}: the teacher's held-out loss is not below the random-init student's."]
    behind = [n for n, ok in student_leads(result).items() if not ok and lead.get(n, True)]
    if behind:
        out += ["", f"BEHIND for {', '.join(behind)}: the distilled student's held-out loss is not below its "
                "random-init twin's (distillation did not pay at this budget)."]  # fmt: skip
    return "\n".join(out)


def _fmt(x) -> str:
    return "" if x is None else f"{x:,.0f}"


def save(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "distill_gpu.json.tmp"
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(out / "distill_gpu.json")


def main(argv=None) -> dict:
    a = args_of(argv)
    s = SIZES["tiny" if a.tiny else "gpu"]
    if not a.tiny and not torch.cuda.is_available():
        raise SystemExit("error: the GPU sizes need CUDA; pass --tiny for the CPU toy run")
    work = a.work or Path(tempfile.mkdtemp(prefix="distill_gpu_"))
    if work.is_dir() and any(work.iterdir()):
        raise SystemExit(f"error: --work `{work}` is not empty (the runs would mix with what it holds)")
    work.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    result = {"device": device, "sizes": s, "scale": a.scale, "decode_ctx": s["decode_ctx"], "students": {}}
    programs = write_programs(s, work)
    shared = sections(s, work, corpus(work, s["corpus_mb"]))
    t0 = time.perf_counter()
    teacher = teacher_run(s, work, programs["teacher"], shared, steps(s["teacher_steps"], a.scale))
    result["teacher"] = {
        "params": params(programs["teacher"]),
        "train_s": time.perf_counter() - t0,
        "tokens": steps(s["teacher_steps"], a.scale) * s["batch"] * s["seq"],
        **decode_speed(programs["teacher"], s["decode_ctx"]),
    }
    save(result, a.out)
    for name in a.students.split(","):
        t0 = time.perf_counter()
        r = student_run(s, work, name, programs, teacher, shared, a.scale)
        final = r.stages[-1].student
        result["students"][name] = {
            "heldout": r.report["heldout"],
            "stages": r.report["stages"],
            "selection": r.report["selection"],
            "program": final.read_text(),
            "params": params(final),
            "run_s": time.perf_counter() - t0,
            "decode": decode_speed(final, s["decode_ctx"]),
        }
        result["teacher_leads"] = teacher_leads(result)
        if (r.out / "kl_ranking.png").is_file():
            shutil.copy(r.out / "kl_ranking.png", a.out / "kl_ranking.png")
        save(result, a.out)
    (a.out / "distill_gpu.md").write_text(table(result) + "\n")
    print(table(result))
    return result


if __name__ == "__main__":
    main()
