"""Triton cross-entropy of rows of logits with its gradient, one program a row, two reads of the row.

Pass 1 keeps a running max and sum of exponentials per lane over blocks of BV columns (online
softmax, fp32), merged into the row's max m and sum z; the loss is (m − x[label]) + log z. Pass 2
writes exp(x − m) / z − [column = label] in the gradient's dtype, over the logits themselves when G is X
(each block is read before it is written, and rows belong to one program). A row labelled IGNORE
has loss 0 and gradient 0. Per row: 2 reads and 1 write of V values, where the PyTorch form makes
an fp32 copy, a log-softmax, a softmax, a scatter, a mask and a narrowing copy of the row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lt2dsl.kernels.common.backend import check_triton_dtype, triton_interpreting

from .naive import IGNORE


@triton.jit
def _xent_kernel(
    X, Y, LOSS, G, V, stride_x, stride_g,
    IGNORE_ID: tl.constexpr, BV: tl.constexpr, GRADS: tl.constexpr,
):  # fmt: skip
    """Row `program_id(0)`: LOSS[row] and, with GRADS, G[row, :]."""
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    y = tl.load(Y + row).to(tl.int64)
    offs = tl.arange(0, BV)
    m = tl.full([BV], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BV], dtype=tl.float32)
    for v0 in range(0, V, BV):
        cols = v0 + offs
        x = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # lanes still at −inf (masked columns) add nothing and must not form −inf − (−inf)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_safe) + tl.exp(x - m_safe)
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - row_max)), axis=0)
    valid = y != IGNORE_ID
    y_safe = tl.where(valid, y, 0)
    x_y = tl.load(x_row + y_safe).to(tl.float32)
    # lse − x_y and exp(x − lse) from the max and the sum apart: lse rounded to fp32 at |x| ~ 1e3
    # would move every exponential by its 6e-5 ulp
    tl.store(LOSS + row, tl.where(valid, (row_max - x_y) + tl.log(total), 0.0))
    if GRADS:
        g_row = G + row * stride_g
        inv = 1.0 / total
        for v0 in range(0, V, BV):
            cols = v0 + offs
            x = tl.load(x_row + cols, mask=cols < V, other=0.0).to(tl.float32)
            g = tl.exp(x - row_max) * inv - tl.where(cols == y_safe, 1.0, 0.0)
            g = tl.where(valid, g, 0.0)
            tl.store(g_row + cols, g.to(G.dtype.element_ty), mask=cols < V)


def _cfg(V: int) -> dict:
    """Columns a block and warps: 4096 columns, 8 warps on the GPU (a 32k-vocab row in 8 blocks)."""
    if triton_interpreting():
        return dict(BV=min(64, triton.next_power_of_2(V)), num_warps=1)
    return dict(BV=min(4096, triton.next_power_of_2(V)), num_warps=8)


def xent_triton(logits: torch.Tensor, labels: torch.Tensor, grads: bool, in_place: bool = True):
    """`xent_reference`'s (loss sum fp32, gradient or None) for logits `[n, V]` (fp32, bf16 or fp16,
    unit column stride) and int labels `[n]`; the gradient in the logits' dtype, written over the
    logits with `in_place` (they are the chunk's own, used once)."""
    check_triton_dtype(logits)
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        shapes = f"{list(logits.shape)} and {list(labels.shape)}"
        raise ValueError(f"logits [n, V] and labels [n] expected, got {shapes}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    n, V = logits.shape
    loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    g = None
    if grads:
        g = logits if in_place else torch.empty_like(logits)
    if n:
        cfg = _cfg(V)
        _xent_kernel[(n,)](
            logits, labels.contiguous(), loss, logits if g is None else g, V, logits.stride(0),
            logits.stride(0) if g is None else g.stride(0), IGNORE_ID=IGNORE, BV=cfg["BV"], GRADS=grads,
            num_warps=cfg["num_warps"],
        )  # fmt: skip
    return loss.sum(), g
