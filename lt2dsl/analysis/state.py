"""Probes of the recurrent states a model writes: numerical rank and receptive field.

Run over a batch of token rows `[B, L]` with a decode cache, an `LT2Model` leaves the state
S `[B, H, K, V]` of each (iteration, block) application in the cache (a looped block has one per
iteration). For each application and head:

* rank: the numerical rank of S (singular values above `tol` · σ_max, mean over rows) and its
  effective rank exp(H(σ / Σσ)) (Roy & Vetterli 2007), against min(K, V);
* receptive field: the token at position p of every row is replaced by another id, the model is
  run again, and influence(p) = ‖S' − S‖_F / ‖S‖_F (mean over rows). The receptive field is
  L − p_min, p_min the earliest probed position whose influence reaches `eps`: how far back a
  token still moves the state after L tokens. A delta rule that forgets (decay, overwrites) has a
  field shorter than L; a loop's later iterations read tokens through the earlier ones.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from lt2dsl.ir import nodes as n


@dataclass(frozen=True)
class Application:
    """The k-th (iteration, block) application in execution order (the cache's entry k)."""

    k: int
    block: int
    iteration: tuple[int, ...]
    kinds: tuple[str, ...]


def applications(model) -> list[Application]:
    """Every application of an `LT2Model`, in the order its forward (and its cache) uses them."""
    index = {b.block_id: i for i, b in enumerate(model.blocks)}
    out: list[Application] = []

    def walk(stages, it: tuple[int, ...]) -> None:
        for s in stages:
            if isinstance(s, n.LoopBlock):
                for t in range(s.T):
                    walk(s.body, (*it, t))
            else:
                kinds = tuple(m.type for m in s.mixers)
                out.append(Application(len(out), index[s.id], it, kinds))

    walk(model.ir.body, ())
    return out


@dataclass(frozen=True)
class StateRow:
    """One head of one application's state."""

    k: int
    block: int
    iteration: str
    kind: str
    head: int
    shape: tuple[int, int]
    rank: float
    effective_rank: float
    receptive_field: int
    first_influence: float

    def to_json(self) -> dict:
        return asdict(self)


def _states(model, ids: torch.Tensor) -> dict[tuple[int, int], torch.Tensor]:
    """(application k, mixer j) → S `[B, H, K, V]` after the rows `ids`, for 4-D `state` entries."""
    cache = model.new_cache(ids.shape[0])
    model(ids, cache)
    out = {}
    for app in applications(model):
        entry = cache.entry(app.k)
        for j in range(len(app.kinds)):
            key = "state" if len(app.kinds) == 1 else f"{j}.state"
            S = entry.get(key)
            if isinstance(S, torch.Tensor) and S.dim() == 4:
                out[(app.k, j)] = S.detach().to(torch.float64)
    return out


def rank_stats(S: torch.Tensor, tol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, the mean numerical rank and mean effective rank of S `[B, H, K, V]` → `[H]` each."""
    sv = torch.linalg.svdvals(S)  # [B, H, min(K, V)]
    top = sv[..., :1].clamp_min(torch.finfo(sv.dtype).tiny)
    rank = (sv > tol * top).sum(-1).to(torch.float64).mean(0)
    p = sv / sv.sum(-1, keepdim=True).clamp_min(torch.finfo(sv.dtype).tiny)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
    return rank, entropy.exp().mean(0)


def perturbed(ids: torch.Tensor, positions: list[int], vocab: int, seed: int) -> torch.Tensor:
    """`[P · B, L]`: for each probed position p, the rows with their token at p replaced by
    another id of `[0, vocab)` (drawn per row and position, never the original)."""
    g = torch.Generator().manual_seed(seed)
    out = ids.repeat(len(positions), 1)
    B = ids.shape[0]
    for i, p in enumerate(positions):
        shift = torch.randint(1, vocab, (B,), generator=g)
        out[i * B : (i + 1) * B, p] = (ids[:, p].cpu() + shift).remainder(vocab).to(ids.device)
    return out


@torch.no_grad()
def state_probe(
    model,
    ids: torch.Tensor,
    *,
    vocab: int | None = None,
    probes: int = 32,
    eps: float = 1e-3,
    tol: float = 1e-3,
    seed: int = 0,
) -> list[StateRow]:
    """Rank and receptive field of every matrix state the model writes for rows `ids [B, L]`.

    Args:
        vocab: ids drawn for the replaced tokens (default the model's vocabulary).
        probes: positions probed, evenly spaced from 0 to L − 1.
        eps: the influence that counts as "moves the state". tol: the rank's cut-off.
    """
    was_training = model.training
    model.eval()
    try:
        L = ids.shape[1]
        vocab = vocab or model.config.vocab
        positions = sorted({round(i * (L - 1) / max(1, probes - 1)) for i in range(min(probes, L))})
        base = _states(model, ids)
        moved = _states(model, perturbed(ids, positions, vocab, seed))
    finally:
        model.train(was_training)
    apps = {a.k: a for a in applications(model)}
    rows = []
    for (k, j), S in base.items():
        rank, eff = rank_stats(S, tol)
        B, H = S.shape[:2]
        Sp = moved[(k, j)].view(len(positions), B, *S.shape[1:])
        norm = S.flatten(2).norm(dim=-1).clamp_min(1e-300)  # [B, H]
        infl = ((Sp - S).flatten(3).norm(dim=-1) / norm).mean(1)  # [P, H]
        app = apps[k]
        for h in range(H):
            reach = [p for p, x in zip(positions, infl[:, h].tolist()) if x >= eps]
            rows.append(
                StateRow(
                    k,
                    app.block,
                    "/".join(map(str, app.iteration)) or "-",
                    app.kinds[j],
                    h,
                    (S.shape[2], S.shape[3]),
                    float(rank[h]),
                    float(eff[h]),
                    L - reach[0] if reach else 0,
                    float(infl[0, h]) if not math.isnan(infl[0, h]) else 0.0,
                )
            )
    return rows
