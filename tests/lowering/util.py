"""Shared helpers of the lowering tests: tiny models from `.lt2` text, per-kind tiny options."""

from __future__ import annotations

from typing import Any

import torch

from lt2dsl.frontend import load_or_raise
from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import REGISTRY
from lt2dsl.lowering import compile_model

KINDS = tuple(REGISTRY)

# Options that keep every kind tiny and exercise its interesting paths within ~12 tokens:
# windows and top-k smaller than the sequence, NSA blocks that complete, a short tmm kernel.
TINY = {
    "full": "gate=sdpa, qk_norm=true",
    "swa": "window=4",
    "dsa": "topk=4, index_heads=2, index_dim=8",
    "nsa": "block=4, select=2, window=4, cmp_block=4, stride=2, kv_heads=1",
    "gdn": "expand_v=1",
    "kda": "",
    "deltanet": "",
    "gla": "gate_rank=4",
    "retnet": "",
    "mamba2": "state=8, head_dim=16",
    "mlstm": "",
    "linear": "",
    "tmm": "heads=2, kernel=2, max_len=32",
}

SETTINGS = {"dim": 32, "vocab": 64, "heads": 2, "head_dim": 16}


def call(kind: str, extra: str = "") -> str:
    """`kind(tiny options, extra)` as .lt2 text."""
    opts = ", ".join(o for o in (TINY.get(kind, ""), extra) if o)
    return f"{kind}({opts})" if opts else kind


def text(body: str, **settings) -> str:
    """A model file around `body` with the tiny default settings (overridable)."""
    st = {**SETTINGS, **settings}
    lines = [f"  {k} = {v}" for k, v in st.items()]
    return "model t {\n" + "\n".join(lines) + f"\n\n  {body}\n}}\n"


def resolved(body: str, **settings) -> n.Model:
    """Parse, validate and resolve a tiny model (errors raise `DiagnosticError`)."""
    return load_or_raise(text(body, **settings)).model


def lower(
    body: str,
    *,
    dtype=torch.float64,
    backend: str = "reference",
    seed: int = 0,
    device=None,
    overrides: dict | None = None,
    fuse: bool = False,
    **settings,
):
    """A tiny `LT2Model` of `body`, float64 reference by default, seeded init. Unfused unless
    asked: these tests pin the lowering's own graph; the fusion tests fuse it themselves."""
    torch.manual_seed(seed)
    return compile_model(
        resolved(body, **settings),
        backend=backend,
        dtype=dtype,
        device=device,
        overrides=overrides,
        fuse=fuse,
    )


def tokens(B: int, T: int, vocab: int = 64, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g)


def run_chunks(
    model, ids: torch.Tensor, sizes: list[int], max_len: int | None = None
) -> tuple[torch.Tensor, Any]:
    """Feed `ids` through one cache in chunks of `sizes` tokens; concatenated logits and the cache."""
    cache = model.new_cache(ids.shape[0], max_len)
    outs, t = [], 0
    for s in sizes:
        outs.append(model(ids[:, t : t + s], cache))
        t += s
    assert t == ids.shape[1]
    return torch.cat(outs, dim=1), cache
