"""`nsa(backend="triton")`: NSA assembled from the family's Triton kernels.

* compressed branch: the attention kernel with key c at position c·d + l − 1 (`kstride`, `koff`),
  forward and backward, over mean-pooled (or caller-supplied) compressed keys and values;
* block choice: `lt2dsl::nsa_group_probs` (Triton) turns the branch's lse back into probabilities
  averaged over the GQA group, then the shared ranking rule picks the top-n blocks (torch.topk);
* selected branch: DSA's sparse-attention kernel with per-kv-head indices, each chosen block expanded
  to its l' token positions;
* sliding window: the attention kernel with `window`.
The gates are applied in fp32 by PyTorch (autograd gives their gradients).
"""

from __future__ import annotations

import itertools

import torch

from lt2dsl.kernels.common.custom_op import custom_op

from ..attention.ops import attn_decode_op, attn_fwd_op, decode_eligible
from ..common.attn_utils import topk_select
from ..common.backend import check_triton_dtype
from ..dsa.ops import dsa_attn_fwd_op
from .common import NSAGeometry, apply_quota, block_ranking_inputs, mean_pool, n_slots, slc_scores
from .triton_scores import group_probs

Tensor = torch.Tensor


@custom_op("lt2dsl::nsa_group_probs", mutates_args=())
def group_probs_op(
    q: Tensor, k_cmp: Tensor, lse: Tensor, scale: float, qoff: int, stride: int, koff: int
) -> Tensor:
    """`[B, HKV, Tq, NC]` compressed probabilities averaged over each GQA group (no gradient)."""
    return group_probs(q, k_cmp, lse, scale, qoff, stride, koff)


@group_probs_op.register_fake
def _(q, k_cmp, lse, scale, qoff, stride, koff):
    return q.new_empty(q.shape[0], k_cmp.shape[2], q.shape[1], k_cmp.shape[1], dtype=torch.float32)


def choose_blocks(q, kc, lse, scale: float, qoff: int, Tk: int, geo: NSAGeometry, block_counts) -> Tensor:
    """Top-n selection blocks per kv head: `[B, Tq, HKV, S]`, rank order, −1 pads."""
    B, Tq = q.shape[:2]
    if kc.shape[1]:
        p = group_probs_op(q.detach(), kc.detach().contiguous(), lse, scale, qoff, geo.stride, geo.cmp - 1)
    else:
        p = q.new_zeros(B, kc.shape[2], Tq, 0, dtype=torch.float32)
    pos = torch.arange(Tq, device=q.device) + qoff
    scores, valid = block_ranking_inputs(slc_scores(p, geo.n_sel(Tk), geo), pos, geo)
    idx = topk_select(scores, valid.expand_as(scores), n_slots(block_counts)).transpose(1, 2)
    return apply_quota(idx, block_counts)


def block_tokens(block_indices: Tensor, sel: int) -> Tensor:
    """`[B, Tq, HKV, S]` blocks -> `[B, Tq, HKV, S·l']` token positions (−1 for empty slots)."""
    tok = block_indices[..., None] * sel + torch.arange(sel, device=block_indices.device)
    return torch.where(block_indices[..., None] >= 0, tok, -1).flatten(-2).contiguous()


def nsa_triton(q, k, v, g_cmp, g_slc, g_swa, *, k_cmp, v_cmp, block_indices, cu_seqlens, **kw):
    """Triton NSA; arguments as `lt2dsl.kernels.nsa.nsa`, `kw` its options block_counts, block_size,
    window_size, scale, cmp_block and cmp_stride. Returns (o, block_indices)."""
    check_triton_dtype(q, k, v)
    if cu_seqlens is not None:
        return _by_sequence(q, k, v, g_cmp, g_slc, g_swa, block_indices, cu_seqlens, kw)
    block_counts, window_size, scale = kw["block_counts"], kw["window_size"], kw["scale"]
    geo = NSAGeometry.make(kw["block_size"], kw["cmp_block"], kw["cmp_stride"])
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    # k, v stay as they are where a kernel takes their strides (the selected branch; the window
    # branch in decode): in the lowering's decode they are views of the KV cache
    q = q.contiguous()
    Tq, Tk = q.shape[1], k.shape[1]
    qoff = Tk - Tq
    kc = (mean_pool(k, geo) if k_cmp is None else k_cmp).to(q.dtype).contiguous()
    vc = (mean_pool(v, geo) if v_cmp is None else v_cmp).to(q.dtype).contiguous()
    if kc.shape[1]:
        cmp_keys = dict(kstride=geo.stride, koff=geo.cmp - 1, qoff=qoff, recipe="")
        o_cmp, lse = attn_fwd_op(q, kc, vc, None, scale, True, 0, None, None, **cmp_keys)
    else:
        o_cmp = q.new_zeros(*q.shape[:3], v.shape[-1])
        lse = torch.full((q.shape[2], q.shape[0] * Tq), float("inf"), device=q.device)
    if block_indices is None:
        block_indices = choose_blocks(q, kc, lse.detach(), scale, qoff, Tk, geo, block_counts)
    o_slc = dsa_attn_fwd_op(q, k, v, block_tokens(block_indices, geo.sel), scale)[0]
    o = _gated(o_slc, g_slc)
    if g_cmp is not None:
        o = o + _gated(o_cmp, g_cmp)
    if window_size > 0:
        if decode_eligible(q, k, v, True, None):
            seqlens = torch.full((q.shape[0],), Tk, dtype=torch.int32, device=q.device)
            o_swa = attn_decode_op(q, k, v, seqlens, None, scale, int(window_size), False)
        else:
            kv = k.contiguous(), v.contiguous()
            o_swa = attn_fwd_op(q, *kv, None, scale, True, int(window_size), None, None, 1, 0, qoff, "")[0]
        o = o + _gated(o_swa, g_swa)
    return o.to(v.dtype), block_indices


def _gated(o: Tensor, g: Tensor | None) -> Tensor:
    """g[..., None] · o in fp32 (None: weight 1)."""
    return o.float() if g is None else o.float() * g.float()[..., None]


def _by_sequence(q, k, v, g_cmp, g_slc, g_swa, block_indices, cu_seqlens, kw):
    """Packed batch: run each sequence on its own (block indices are local, as the peer's)."""
    if not isinstance(kw["block_counts"], int) or isinstance(cu_seqlens, tuple | list):
        raise ValueError("Triton NSA with cu_seqlens takes an int block_counts and one cu_seqlens")
    cu = cu_seqlens.tolist()
    outs, idxs = [], []
    for a, b in itertools.pairwise(cu):
        sl = slice(a, b)
        gs = [None if g is None else g[:, sl] for g in (g_cmp, g_slc, g_swa)]
        bi = None if block_indices is None else block_indices[:, sl]
        o, i = nsa_triton(
            q[:, sl], k[:, sl], v[:, sl], *gs, k_cmp=None, v_cmp=None, block_indices=bi, cu_seqlens=None, **kw
        )
        outs.append(o)
        idxs.append(i)
    return torch.cat(outs, dim=1), torch.cat(idxs, dim=1)
