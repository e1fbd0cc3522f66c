"""NSA geometry shared by the naive, reference and Triton forms (mixers.md §10).

Three sizes: selection block l' (`block_size`), compression block l (`cmp_block`, default l') and
compression stride d (`cmp_stride`, default l). Compression block i covers tokens [i·d, i·d + l) and is
visible to the query at position t iff i·d + l − 1 ≤ t (entirely in the past, self included).
Selection block j covers [j·l', (j + 1)·l').
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NSAGeometry:
    """Block sizes: `sel` = l', `cmp` = l, `stride` = d."""

    sel: int
    cmp: int
    stride: int

    @staticmethod
    def make(block_size: int, cmp_block: int | None, cmp_stride: int | None) -> NSAGeometry:
        l = block_size if cmp_block is None else int(cmp_block)
        d = l if cmp_stride is None else int(cmp_stride)
        if min(block_size, l, d) < 1:
            raise ValueError(f"block sizes must be >= 1, got l'={block_size}, l={l}, d={d}")
        if l % d or block_size % d:
            raise ValueError(f"cmp_stride d={d} must divide cmp_block l={l} and block_size l'={block_size}")
        return NSAGeometry(block_size, l, d)

    @property
    def is_simple(self) -> bool:
        """The peer's default: l = d = l', so selection scores are the compressed probabilities."""
        return self.sel == self.cmp == self.stride

    def n_cmp(self, T: int) -> int:
        """Number of complete compression blocks in T tokens."""
        return max(0, (T - self.cmp) // self.stride + 1)

    def n_sel(self, T: int) -> int:
        """Number of selection blocks (the last may be partial)."""
        return -(-T // self.sel)


def mean_pool(x: torch.Tensor, geo: NSAGeometry) -> torch.Tensor:
    """Mean-pooled compression φ: `[B, T, H, D]` -> `[B, NC, H, D]` (complete blocks only)."""
    nc = geo.n_cmp(x.shape[1])
    if nc == 0:
        return x.new_zeros(x.shape[0], 0, *x.shape[2:])
    return x.unfold(1, geo.cmp, geo.stride).mean(-1)


def cmp_visible(pos: torch.Tensor, nc: int, geo: NSAGeometry) -> torch.Tensor:
    """`[c, NC]`: compression block i visible to query positions `pos` `[c]`."""
    end = torch.arange(nc, device=pos.device) * geo.stride + geo.cmp - 1
    return end[None, :] <= pos[:, None]


def slc_scores(p_cmp: torch.Tensor, nsb: int, geo: NSAGeometry) -> torch.Tensor:
    """Selection-block importance from compressed probabilities: `[..., NC]` -> `[..., NSB]`.

    p_slc[j] = Σ_{m < l'/d} Σ_{u < l/d} p_cmp[(l'/d)·j − m − u] (out-of-range terms are 0); with
    l = d = l' this is p_cmp itself (mixers.md §10(b)).
    """
    nc = p_cmp.shape[-1]
    if geo.is_simple:
        out = p_cmp.new_zeros(*p_cmp.shape[:-1], nsb)
        n = min(nc, nsb)
        out[..., :n] = p_cmp[..., :n]
        return out
    out = p_cmp.new_zeros(*p_cmp.shape[:-1], nsb)
    if nc == 0:
        return out
    a, b = geo.sel // geo.stride, geo.cmp // geo.stride
    j = torch.arange(nsb, device=p_cmp.device)
    for m in range(a):
        for u in range(b):
            src = a * j - m - u
            ok = (src >= 0) & (src < nc)
            out = out + torch.where(ok, p_cmp[..., src.clamp(0, nc - 1)], 0.0)
    return out


def block_ranking_inputs(p_slc: torch.Tensor, pos: torch.Tensor, geo: NSAGeometry):
    """Scores and validity for the top-n block choice: p_slc `[..., c, NSB]`, pos `[c]`.

    Forced blocks (block 0, the query's current and previous blocks) score +inf so they are always
    taken; blocks after the current one are not allowed.
    """
    nsb = p_slc.shape[-1]
    j = torch.arange(nsb, device=pos.device)[None, :]
    cur = (pos // geo.sel)[:, None]
    forced = (j == 0) | (j == cur) | (j == cur - 1)
    scores = torch.where(forced, torch.full_like(p_slc, float("inf")), p_slc)
    return scores, (j <= cur).expand_as(p_slc)


def apply_quota(block_indices: torch.Tensor, block_counts) -> torch.Tensor:
    """Keep the first `block_counts` selections (int, or a `[B, Tq, HKV]` tensor); −1 the rest."""
    if isinstance(block_counts, int):
        return block_indices
    s = torch.arange(block_indices.shape[-1], device=block_indices.device)
    return torch.where(s < block_counts[..., None].to(block_indices.device), block_indices, -1)


def n_slots(block_counts) -> int:
    """S, the selection slots per query: the int itself or the tensor's maximum."""
    return int(block_counts) if isinstance(block_counts, int) else int(block_counts.max().item())
