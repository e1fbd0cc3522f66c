"""Cross-entropy from the final hidden states and the head weight, a chunk of tokens at a time.

At long context the logits `[tokens, vocab]` dwarf every activation (32k tokens x 128k vocab in
fp32 is 16 GiB). `linear_cross_entropy` never forms them whole: for each chunk of `chunk` tokens
it computes the chunk's logits, its loss and, when gradients are needed, the gradients of that
chunk's hidden states and the head weight (softmax − one-hot), then drops the logits; backward
only scales the stored gradients. Peak extra memory: one chunk's logits and the weight's
gradient `[vocab, D]` in fp32.

Labels equal to -100 take no loss (and give no gradient), as `F.cross_entropy(ignore_index=-100)`.
`label_hits` counts the labelled tokens whose argmax prediction is right, forming logits only at
those tokens (what a curriculum task needs; a task labels few positions).
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.xent import IGNORE, xent
from lt2dsl.kernels.xent.naive import wide_dtype

__all__ = ["IGNORE", "accumulate", "label_hits", "linear_cross_entropy", "wide_dtype"]


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk: int = 4096,
    dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Σ over tokens with a label of −log softmax(hidden · weightᵀ)[label], in fp32.

    Args:
        hidden (torch.Tensor): `[..., D]` final hidden states (after the final norm).
        weight (torch.Tensor): `[V, D]` the LM head (or the tied embedding).
        labels (torch.Tensor): `[...]` next-token ids, -100 where no loss is taken.
        chunk (int, Optional): tokens per chunk. Default: `4096`.
        dtype (torch.dtype, Optional): dtype of the logits matmul (its accumulation is fp32);
            default `hidden`'s dtype.
        backend (str, Optional): each chunk's softmax, loss and gradient (`kernels.xent`): "auto"
            (the Triton kernel on CUDA, PyTorch elsewhere), "triton" or "reference". Default: "auto".
    Returns:
        torch.Tensor: a scalar fp32 (float64 for float64 inputs) sum; divide by the number of
        labelled tokens for the mean.
    """
    h, y = token_rows(hidden, labels)
    dtype = dtype or hidden.dtype
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h, weight, y, int(chunk), dtype, backend)
    with torch.no_grad():
        return accumulate(h, weight, chunk, dtype, lambda rows, x: xent(x, y[rows], False, backend))[0]


def token_rows(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden `[..., D]` and labels `[...]` as rows `[N, D]` and `[N]`; a ValueError when the
    leading dims disagree."""
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden {list(hidden.shape)} and labels {list(labels.shape)} disagree")
    return hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)


def accumulate(h, weight, chunk: int, dtype: torch.dtype, chunk_loss, need_dh=False, need_dw=False):
    """The chunk loop of a loss on the head's logits (this file's, and `distill/kl.py`'s).

    For each `chunk` rows of `h` `[N, D]`, `chunk_loss(rows, logits)` — logits `h[rows] @ weightᵀ`
    `[n, V]` in `dtype` — returns the chunk's loss sum and d(loss)/d(logits) (None when no gradient
    is needed). Returns the total and the gradients of `h` and of `weight` `[V, D]` where asked
    (else None), under no autocast: the products in `dtype`, the chunks' sums in the wide dtype.
    """
    wide = wide_dtype(dtype)
    total = torch.zeros((), dtype=wide, device=h.device)
    dh = torch.empty_like(h) if need_dh else None
    dw = torch.zeros(weight.shape, dtype=wide, device=weight.device) if need_dw else None
    w = weight.to(dtype)
    with torch.autocast(h.device.type, enabled=False):
        for s in range(0, h.shape[0], chunk):
            rows = slice(s, s + chunk)
            hc = h[rows].to(dtype)
            loss, g = chunk_loss(rows, hc @ w.t())
            total += loss
            if g is None:
                continue
            # both products in `dtype` (tensor cores for bf16: an fp32 gᵀh ran on CUDA cores, a
            # fifth of a 32k-token training step); each chunk's [V, D] sums in the wide dtype
            gc = g.to(dtype)
            if dh is not None:
                dh[rows] = (gc @ w).to(h.dtype)
            if dw is not None:
                dw += (gc.t() @ hc).to(wide)
    return total, dh, dw


def save_grads(ctx, dh: torch.Tensor | None, dw: torch.Tensor | None, weight: torch.Tensor) -> None:
    """Keep a chunked loss's gradients (from `accumulate`) for `stored_grads`."""
    ctx.save_for_backward(dh, dw)
    ctx.weight_dtype = weight.dtype


def stored_grads(ctx, grad_out: torch.Tensor, inputs: int) -> tuple:
    """Backward of a chunked loss whose forward saved (dh, dw) and `weight_dtype`: those scaled by
    `grad_out`, None for the other `inputs - 2` inputs."""
    dh, dw = ctx.saved_tensors
    gh = None if dh is None else dh * grad_out.to(dh.dtype)
    gw = None if dw is None else (dw * grad_out).to(ctx.weight_dtype)
    return (gh, gw) + (None,) * (inputs - 2)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, chunk, dtype, backend):
        total, dh, dw = accumulate(
            h,
            weight,
            chunk,
            dtype,
            lambda rows, logits: xent(logits, labels[rows], True, backend),
            *ctx.needs_input_grad[:2],
        )
        save_grads(ctx, dh, dw, weight)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        return stored_grads(ctx, grad_out, 6)


@torch.no_grad()
def label_hits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk: int = 4096,
    dtype: torch.dtype | None = None,
    dense: bool = False,
) -> torch.Tensor:
    """How many labelled tokens (label != -100) the argmax of hidden · weightᵀ predicts right.

    Logits exist only for the labelled tokens, `chunk` of them at a time.

    Args:
        hidden (torch.Tensor): `[..., D]` final hidden states (after the final norm).
        weight (torch.Tensor): `[V, D]` the LM head (or the tied embedding).
        labels (torch.Tensor): `[...]` next-token ids, -100 where nothing is predicted.
        chunk (int, Optional): labelled tokens per chunk. Default: `4096`.
        dtype (torch.dtype, Optional): dtype of the logits matmul; default `hidden`'s dtype.
        dense (bool, Optional): logits for every token, `chunk` at a time, and the count masked:
            no wait for the host (the labelled tokens' positions), what a CUDA graph captures.
            Default: `False`.
    Returns:
        torch.Tensor: a scalar int64 count on `hidden`'s device.
    """
    h, y = token_rows(hidden, labels)
    y = y.to(hidden.device)
    if dense:
        return _dense_hits(h, weight, y, chunk, dtype or hidden.dtype)
    at = (y != IGNORE).nonzero().squeeze(1)  # [n] the labelled tokens
    dtype = dtype or hidden.dtype
    w = weight.to(dtype)
    hits = torch.zeros((), dtype=torch.int64, device=hidden.device)
    with torch.autocast(h.device.type, enabled=False):
        for s in range(0, at.numel(), chunk):
            idx = at[s : s + chunk]
            hits += ((h[idx].to(dtype) @ w.t()).argmax(-1) == y[idx]).sum()
    return hits


def _dense_hits(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, chunk: int, dtype) -> torch.Tensor:
    """`label_hits` over rows h `[N, D]`, labels y `[N]`, with shapes that do not depend on y."""
    w = weight.to(dtype)
    hits = torch.zeros((), dtype=torch.int64, device=h.device)
    with torch.autocast(h.device.type, enabled=False):
        for s in range(0, h.shape[0], chunk):
            yc = y[s : s + chunk]
            right = (h[s : s + chunk].to(dtype) @ w.t()).argmax(-1) == yc
            hits += (right & (yc != IGNORE)).sum()
    return hits
