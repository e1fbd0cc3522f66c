"""GPU smoke run: every example model, and a full-size 12-layer GDN model, through the public API.

Each `examples/*.lt2` is compiled with `backend="auto"` (Triton kernels on a GPU, the PyTorch
reference on a CPU) at a small size: every `repeat`/`* n` once, loops at T = 2, a narrow model
(`--size small`: the examples' own head dims, 2 sequences of 256 tokens; `--size toy`: 2 heads of
32, 16 tokens, for the CPU). Per model: a forward with the next-token loss, a backward (every
gradient finite, some non-zero), a prefill of all but the last DECODE_STEPS tokens with one decode
step per remaining token checked against one forward over the whole sequence, and `generate`.
The 12-layer GDN model of issue 33 runs at its full size (at the toy size on a CPU).

    make gpu-smoke                                        # on the GPU machine (carry .whl)
    python bench/gpu_smoke.py --size toy --json out.json  # on a CPU

One line per model (forward loss, gradient norm, decode agreement, time) after the card's name;
`--json` writes every result. Exit status 1 when any model fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gdn12 import GDN12  # noqa: E402

DECODE_STEPS = 4
# (settings overridden on the examples, batch, tokens); `toy` also narrows the heads
SIZES = {
    "small": ({"dim": 512, "vocab": 4096, "loop_T": 2}, 2, 256),
    "toy": ({"dim": 64, "vocab": 256, "loop_T": 2, "heads": 2, "head_dim": 32}, 2, 16),
}
# parameter dtype: the models' own (bf16) at the GPU sizes, fp32 for the CPU's reference
DTYPES = {"small": None, "toy": "fp32"}
# the 12-layer model: full size on a GPU (B=2, T=2048), the toy size elsewhere
GDN12_SIZES = {"small": ({}, 2, 2048), "toy": ({"dim": 64, "vocab": 256}, 2, 16)}
# relative RMS error of prefill + decode against one forward: bf16 activations round at every layer
DECODE_TOL = {"bfloat16": 5e-2, "float16": 5e-2, "float32": 1e-3, "float64": 1e-9}


@dataclass
class Result:
    """One model's smoke run; `error` says what failed (None when everything passed)."""

    name: str
    ok: bool = False
    loss: float = math.nan
    grad_norm: float = math.nan
    decode_error: float = math.nan
    decode_tol: float = math.nan
    generated: int = 0
    seconds: float = 0.0
    error: str | None = None
    size: dict = field(default_factory=dict)


def shrink(program):
    """The program with every `repeat n` and `* n` run once (loops kept)."""
    from lt2dsl.ir import nodes as n

    def item(x):
        if isinstance(x, n.Repeat):
            return x.model_copy(update={"n": 1, "body": tuple(map(item, x.body))})
        if isinstance(x, n.Times):
            return x.model_copy(update={"n": 1, "item": item(x.item)})
        if isinstance(x, n.Loop):
            return x.model_copy(update={"body": tuple(map(item, x.body))})
        return x

    lets = tuple(let.model_copy(update={"item": item(let.item)}) for let in program.lets)
    return program.model_copy(update={"body": tuple(map(item, program.body)), "lets": lets})


def narrow(program, base: dict) -> dict:
    """Overrides for one program: `base`, its MLP (if it sets one) at 4 x dim units of its own
    kind, and with `base` narrowing the heads, one kv head where it sets a kv head count."""
    out = dict(base)
    for s in program.settings:
        if s.name == "mlp" and getattr(s.value, "name", "none") != "none":
            out["mlp"] = f"{s.value.name}(hidden={4 * base['dim']})"
        if s.name == "kv_heads" and "heads" in base:
            out["kv_heads"] = 1
    return out


def parse(text: str, name: str):
    from lt2dsl.diagnostics import DiagnosticError
    from lt2dsl.grammar.parse import parse as parse_text

    program, diags = parse_text(text, name)
    if program is None:
        raise DiagnosticError(diags)
    return program


def decode_error(model, ids, steps: int) -> float:
    """Relative RMS error ‖prefill + decode − forward‖ / ‖forward‖ over the last `steps` positions
    of ids `[B, T]`: one forward over all T tokens against a prefill of T − steps tokens and one
    decode step per remaining token through one cache."""
    import torch

    T = ids.shape[1]
    with torch.no_grad():
        whole = model(ids)[:, T - steps :].float()
        cache = model.new_cache(ids.shape[0])
        model(ids[:, : T - steps], cache)
        pieces = [model(ids[:, t : t + 1], cache) for t in range(T - steps, T)]
    stepwise = torch.cat(pieces, dim=1).float()
    return float((stepwise - whole).norm() / whole.norm().clamp_min(1e-30))


def train_step(model, ids) -> tuple[float, float]:
    """(next-token loss, global gradient norm) of one forward and backward; raises when a
    gradient is not finite or all are zero."""
    import torch
    import torch.nn.functional as F

    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(ids)
    loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    loss = float(loss.detach())
    grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
    if not grads:
        raise RuntimeError("backward produced no gradient")
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    if not math.isfinite(loss) or not math.isfinite(norm) or norm == 0.0:
        raise RuntimeError(f"loss {loss}, gradient norm {norm}")
    return loss, norm


def run_model(name: str, program, overrides: dict, batch: int, tokens: int, device, dtype=None) -> Result:
    """Compile `program` with `overrides` (backend "auto") and smoke-test it on `batch` x `tokens`."""
    import torch

    import lt2dsl

    res = Result(name, size={**overrides, "batch": batch, "tokens": tokens})
    t0 = time.perf_counter()
    try:
        model = lt2dsl.compile(program, backend="auto", device=device, dtype=dtype, **overrides)
        vocab = model.config.vocab
        gen = torch.Generator(device="cpu").manual_seed(0)
        ids = torch.randint(0, vocab, (batch, tokens), generator=gen).to(device)
        res.loss, res.grad_norm = train_step(model, ids)
        model.eval()
        res.decode_error = decode_error(model, ids, min(DECODE_STEPS, tokens - 1))
        res.decode_tol = DECODE_TOL[str(next(model.parameters()).dtype).removeprefix("torch.")]
        out = model.generate(ids[:, : max(1, tokens // 2)], max_new_tokens=DECODE_STEPS)
        res.generated = out.shape[1] - max(1, tokens // 2)
        ok_ids = bool(((out >= 0) & (out < vocab)).all())
        if res.decode_error > res.decode_tol:
            res.error = (
                f"prefill + decode differs from one forward: {res.decode_error:.2e} > {res.decode_tol:.0e}"
            )
        elif res.generated != DECODE_STEPS or not ok_ids:
            res.error = f"generate returned {res.generated} new tokens (ids in range: {ok_ids})"
        res.ok = res.error is None
    except Exception as e:  # a model's failure is its result; the next model still runs
        res.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        traceback.print_exc(file=sys.stderr)
    if device.type == "cuda":
        torch.cuda.synchronize()
    res.seconds = round(time.perf_counter() - t0, 2)
    return res


def line(r: Result) -> str:
    status = "ok  " if r.ok else "FAIL"
    text = (f"{status} {r.name:26s} fwd loss {r.loss:7.3f}  bwd |g| {r.grad_norm:9.3e}  "
            f"decode {r.decode_error:8.1e} (tol {r.decode_tol:.0e})  {r.seconds:6.1f} s")  # fmt: skip
    return text + (f"  {r.error}" if r.error else "")


def device_info(device) -> dict:
    import torch
    import triton

    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (reference backend)"
    return {"card": card, "torch": torch.__version__, "triton": triton.__version__}


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def models(size: str, only: list[str] | None) -> list[tuple[str, object, dict, int, int]]:
    """(name, program, overrides, batch, tokens) of each example and of the 12-layer GDN model."""
    base, batch, tokens = SIZES[size]
    out = []
    for path in sorted((ROOT / "examples").glob("*.lt2")):
        program = shrink(parse(path.read_text(), str(path)))
        out.append((path.stem, program, narrow(program, base), batch, tokens))
    over, b12, t12 = GDN12_SIZES[size]
    program = parse(GDN12, "gdn12.lt2")
    if size != "small":
        program = shrink(program)
        over = narrow(program, over)
    out.append(("gdn12" + ("" if size == "small" else "-toy"), program, over, b12, t12))
    return [m for m in out if not only or m[0] in only]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--size", choices=sorted(SIZES), default=None, help="default: small on a GPU, toy on a CPU"
    )
    ap.add_argument("--only", nargs="*", default=None, help="model names (example stems, gdn12)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size = args.size or ("small" if device.type == "cuda" else "toy")
    if device.type == "cpu":
        torch.set_num_threads(1)
    info = device_info(device)
    print(f"{info['card']}: torch {info['torch']}, Triton {info['triton']}, size {size}", flush=True)
    results = []
    for name, program, overrides, batch, tokens in models(size, args.only):
        results.append(run_model(name, program, overrides, batch, tokens, device, DTYPES[size]))
        print(line(results[-1]), flush=True)
        # after every model: a run cut by a time limit keeps what it finished
        if args.json is not None:
            write_json(args.json, {**info, "size": size, "results": [asdict(r) for r in results]})
    failed = [r.name for r in results if not r.ok]
    print(f"{len(results) - len(failed)}/{len(results)} models passed on {info['card']}")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
