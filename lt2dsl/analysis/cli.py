"""`lt2dsl analyze WEIGHTS --model M.lt2 [--task NAME --data K=V | --length L]`: the probes as tables.

Two tables: the Fredholm index of each `tmm` layer with the winding number of each of its
symbols, and the rank and receptive field of every matrix state (delta rules and the other
recurrent mixers), per (iteration, block) application and head. The probe rows are a test
batch of `--task` when given, else uniform random ids of `--length` tokens. JSON with `--json`.
"""

from __future__ import annotations

import argparse

from lt2dsl.tasks.cli import (
    EXIT_OK,
    CommandError,
    add_model_arguments,
    add_task_arguments,
    emit_json,
    model_of,
    positive,
    task_config,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_task_arguments(p, required=False)
    p.add_argument("--length", type=positive, default=256, help="probe length without --task (default 256)")
    p.add_argument("--rows", type=positive, default=4, help="probe rows (default 4)")
    p.add_argument("--probes", type=positive, default=32, help="positions probed for the receptive field")
    p.add_argument("--eps", type=float, default=1e-3, help="influence that counts as reaching the state")
    p.add_argument("--tol", type=float, default=1e-3, help="relative cut-off of the numerical rank")
    p.add_argument("--symbol-length", type=positive, help="Toeplitz coefficients used (default max_len)")


def probe_ids(args: argparse.Namespace, model):
    """`[rows, L]` ids: a test batch of the task, or uniform random ids; and their vocabulary."""
    import torch

    if args.task:
        from lt2dsl.tasks import build
        from lt2dsl.tasks.eval import check_model_fits

        source = build(task_config(args))
        try:
            check_model_fits(model, source.cfg)
        except ValueError as e:
            raise CommandError(str(e)) from None
        ids = source.batch(0, args.rows, args.seed, split="test")[0]
        return ids, source.vocab_size
    L = min(args.length, model.max_len or args.length)
    g = torch.Generator().manual_seed(args.seed)
    return torch.randint(0, model.config.vocab, (args.rows, L), generator=g), model.config.vocab


def run(args: argparse.Namespace, out, err) -> int:
    """`lt2dsl analyze`: the shim's entry."""
    try:
        if args.task:
            task_config(args)
        model = model_of(args, err)
        ids, vocab = probe_ids(args, model)
    except CommandError as e:
        err.file.write(f"error: {e}\n")
        return e.code
    from lt2dsl.analysis.state import state_probe
    from lt2dsl.analysis.toeplitz import toeplitz_layers

    device = next(model.parameters()).device
    layers = toeplitz_layers(model, args.symbol_length)
    states = state_probe(
        model, ids.to(device), vocab=vocab, probes=args.probes, eps=args.eps, tol=args.tol, seed=args.seed
    )
    result = {
        "length": ids.shape[1],
        "rows": ids.shape[0],
        "toeplitz": [x.to_json() for x in layers],
        "states": [r.to_json() for r in states],
    }
    if not emit_json(args.json, result, out):
        from rich.console import Console

        console = Console(file=out.file, soft_wrap=True)
        if layers:
            console.print(toeplitz_table(layers))
        if states:
            console.print(state_table(states, ids.shape[1]))
        if not layers and not states:
            console.print("no Toeplitz layers and no matrix states in this model", markup=False)
    return EXIT_OK


def toeplitz_table(layers):
    from rich.table import Table

    t = Table(title="Toeplitz layers: winding numbers of the symbols a(z) = Σ w[m] zᵐ, Fredholm index")
    for col in ("block", "heads × taps", "length", "windings (diagonal tap, per head)", "certified", "index"):
        t.add_column(col, justify="left" if col.startswith("windings") else "right")
    for x in layers:
        diag = [r for r in x.symbols if r.diagonal]
        winds = " ".join("?" if r.winding is None else str(r.winding) for r in diag)
        cert = all(r.certified for r in x.symbols)
        idx = "undefined" if x.index is None else str(x.index)
        t.add_row(str(x.block), f"{x.heads} × {x.kernel}", str(x.length), winds, "yes" if cert else "no", idx)
    return t


def state_table(rows, length: int):
    from rich.table import Table

    t = Table(title=f"Matrix states after {length} tokens: numerical rank and receptive field")
    cols = ("app", "block", "iteration", "kind", "head", "K × V", "rank", "eff. rank", "field", "first tok")
    for col in cols:
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            str(r.k),
            str(r.block),
            r.iteration,
            r.kind,
            str(r.head),
            f"{r.shape[0]} × {r.shape[1]}",
            f"{r.rank:.1f}",
            f"{r.effective_rank:.1f}",
            str(r.receptive_field),
            f"{r.first_influence:.2e}",
        )
    return t
