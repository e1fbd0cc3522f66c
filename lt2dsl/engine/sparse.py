"""Decode steps of NSA and tmm over static buffers, each row at its own position t_b.

They compute what the lowering's leaves compute for one new token (`nsa_compress` + `nsa_attend`,
`toeplitz_cached`), with every shape taken from the buffers (`L` slots, `NC` compressed blocks) and
everything past a row's position masked, so one step serves rows of any length without a host value.
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.attn_utils import compute_dtype, repeat_kv, topk_select
from lt2dsl.kernels.nsa.common import NSAGeometry, slc_scores
from lt2dsl.kernels.nsa.reference import masked_attention
from lt2dsl.kernels.toeplitz import normalize_weights
from lt2dsl.kernels.toeplitz.naive import shift_channels
from lt2dsl.lowering.functional_sparse import compress_blocks


def compress_rows(buf, x, t, cmp_block: int, stride: int, phi: tuple) -> torch.Tensor:
    """Store, per row, the newest compression block of its tokens into `buf [B, HKV, NC, d]`.

    x `[B, L, HKV, d]`: the key (value) buffer with the new token written at t_b. With m = t_b + 1
    tokens the newest complete block is i = ⌊(m − l)/d⌋, rewritten with the value it already holds
    when the new token completes none; before the first completes (m < l) slot 0 takes a partial
    block, which no query sees before it completes (and is written again). Returns the whole
    buffer as `[B, NC, HKV, d]`.
    """
    B, L, HKV, d = x.shape
    NC = buf.shape[2]
    if NC == 0:
        return buf.transpose(1, 2)
    i = torch.div(t + 1 - cmp_block, stride, rounding_mode="floor").clamp(0, NC - 1)
    tok = (i * stride)[:, None] + torch.arange(cmp_block, device=x.device)
    tok = tok.clamp(max=L - 1)[:, :, None, None].expand(B, cmp_block, HKV, d)
    blocks = x.gather(1, tok).permute(0, 2, 1, 3).unsqueeze(1)  # [B, 1, HKV, l, d]
    new = compress_blocks(blocks, *phi).transpose(1, 2).to(buf.dtype)  # [B, HKV, 1, d]
    return buf.scatter_(2, i.view(B, 1, 1, 1).expand(B, HKV, 1, d), new).transpose(1, 2)


def nsa_rows(q, k, v, g, k_cmp, v_cmp, t, geometry: dict) -> torch.Tensor:
    """NSA of one query per row at position t_b (`nsa_reference`'s three branches and block choice).

    q `[B, 1, HQ, K]`; k, v `[B, L, HKV, *]` buffers; g `[B, 1, HQ, 3]` gates (cmp, slc, swa);
    k_cmp, v_cmp `[B, NC, HKV, *]`. Returns `[B, 1, HQ, V]` in v's dtype.
    """
    B, _, HQ, K = q.shape
    L, HKV = k.shape[1:3]
    G, dt = HQ // HKV, compute_dtype(q, k, v)
    geo = NSAGeometry.make(geometry["block"], geometry["cmp_block"], geometry["stride"])
    kx, vx, kcx, vcx = (repeat_kv(x.to(dt), G) for x in (k, v, k_cmp, v_cmp))
    qc = q.to(dt) * K**-0.5
    pos = t[:, None, None, None]  # [B, 1, 1, 1] against [B, heads, query, keys]
    ends = torch.arange(k_cmp.shape[1], device=q.device) * geo.stride + geo.cmp - 1
    o_cmp, p_cmp = masked_attention(qc, kcx, vcx, ends <= pos)
    tok = torch.arange(L, device=q.device)
    chosen = _choose(p_cmp, pos, geo, geo.n_sel(L), geometry["select"], G)
    o = masked_attention(qc, kx, vx, (chosen[..., tok // geo.sel] & (tok <= pos)).repeat_interleave(G, 1))[0]
    g_cmp, g_slc, g_swa = (x.to(dt)[..., None] for x in g.unbind(-1))
    o = o * g_slc + o_cmp * g_cmp
    w = geometry["window"]
    if w > 0:
        o = o + masked_attention(qc, kx, vx, (tok <= pos) & (tok >= pos - w + 1))[0] * g_swa
    return o.to(v.dtype)


def _choose(p_cmp, pos, geo: NSAGeometry, nsb: int, select: int, G: int) -> torch.Tensor:
    """`[B, HKV, 1, nsb]` selected blocks: top-`select` by the group-averaged compressed
    probabilities, blocks 0, current and previous forced, none after the current one."""
    B, HQ, _, nc = p_cmp.shape
    p_slc = slc_scores(p_cmp.view(B, HQ // G, G, 1, nc).mean(2), nsb, geo)  # [B, HKV, 1, nsb]
    j = torch.arange(nsb, device=p_cmp.device)
    cur = torch.div(pos, geo.sel, rounding_mode="floor")
    forced = (j == 0) | (j == cur) | (j == cur - 1)
    scores = torch.where(forced, torch.full_like(p_slc, float("inf")), p_slc)
    idx = topk_select(scores, (j <= cur).expand_as(p_slc), select)
    hit = torch.zeros(*idx.shape[:-1], nsb + 1, dtype=torch.bool, device=idx.device)
    return hit.scatter_(-1, torch.where(idx >= 0, idx, nsb), True)[..., :nsb]


def toeplitz_rows(buf, t, w, bias, dtype: torch.dtype) -> torch.Tensor:
    """Row b's output at position t_b from its inputs x_0..x_{t_b} in `buf [B, L, C]`:
    y = Σ_j Σ_{s ≤ t_b} w[j, head, t_b − s] x[s, c − k + 1 + j] + bias[head, t_b] → `[B, 1, C]`."""
    B, L, C = buf.shape
    w3, b2 = normalize_weights(w, bias, C, L)
    kernel, heads, _ = w3.shape
    dt = torch.float64 if buf.dtype == torch.float64 else torch.float32
    lag = t[:, None] - torch.arange(L, device=buf.device)  # [B, L]
    taps = w3[:, :, lag.clamp(min=0)].to(dt) * (lag >= 0)  # [kernel, heads, B, L]
    y = buf.new_zeros(B, heads, C // heads, dtype=dt)
    for j in range(kernel):
        xs = shift_channels(buf, kernel - 1 - j).to(dt).view(B, L, heads, C // heads)
        y = y + torch.einsum("bshc,hbs->bhc", xs, taps[j])
    if b2 is not None:
        y = y + b2[:, t].to(dt).T[:, :, None]
    return y.reshape(B, 1, C).to(dtype)
