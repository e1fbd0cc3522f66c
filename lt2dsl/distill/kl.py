"""Logit distillation from hidden states, a chunk of tokens at a time (the `kd` objective).

`linear_kd_loss` takes the student's and the teacher's final hidden states and LM-head weights and
returns, summed over the tokens that have a label,

    ce_weight · CE(student, label) + kl_weight · τ² · KL(softmax(teacher / τ) ‖ softmax(student / τ))

(Hinton et al.'s τ² keeps the KL's gradient scale independent of τ). As the trainer's
`linear_cross_entropy` does, it never forms the `[tokens, vocab]` logits whole: each chunk's
student and teacher logits exist only while that chunk's loss and its gradients with respect to the
student's hidden states and head weight are computed,

    ∂/∂s = ce_weight · (softmax(s) − onehot(label)) + kl_weight · τ · (softmax(s/τ) − softmax(t/τ)),

and backward only scales the stored gradients. Peak extra memory: two chunks' logits, and the head
weight's gradient `[vocab, D]` in fp32. Tokens labelled -100 take no loss and give no gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lt2dsl.train.loss import IGNORE, accumulate, save_grads, stored_grads, wide_dtype


def linear_kd_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    t_hidden: torch.Tensor,
    t_weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    kl_weight: float = 1.0,
    ce_weight: float = 1.0,
    temperature: float = 1.0,
    chunk: int = 4096,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The summed KD loss of the module docstring, in fp32 (float64 for float64 inputs).

    Args:
        hidden (torch.Tensor): `[..., D]` the student's final hidden states (after the final norm).
        weight (torch.Tensor): `[V, D]` the student's LM head (or tied embedding).
        t_hidden (torch.Tensor): `[..., Dt]` the teacher's final hidden states (no gradient).
        t_weight (torch.Tensor): `[V, Dt]` the teacher's LM head.
        labels (torch.Tensor): `[...]` next-token ids, -100 where no loss is taken.
        kl_weight, ce_weight (float, Optional): the two terms' weights. Default: `1.0` each.
        temperature (float, Optional): τ of the KL term. Default: `1.0`.
        chunk (int, Optional): tokens per chunk. Default: `4096`.
        dtype (torch.dtype, Optional): dtype of the logits matmuls; default `hidden`'s.
    """
    if hidden.shape[:-1] != labels.shape or t_hidden.shape[:-1] != labels.shape:
        raise ValueError(
            f"hidden {list(hidden.shape)}, teacher hidden {list(t_hidden.shape)} and labels "
            f"{list(labels.shape)} disagree"
        )
    if weight.shape[0] != t_weight.shape[0]:
        raise ValueError(f"student vocab {weight.shape[0]} and teacher vocab {t_weight.shape[0]} differ")
    h = hidden.reshape(-1, hidden.shape[-1])
    th = t_hidden.reshape(-1, t_hidden.shape[-1]).detach()
    terms = (float(kl_weight), float(ce_weight), float(temperature))
    dtype = dtype or hidden.dtype
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearKD.apply(h, weight, th, t_weight.detach(), labels.reshape(-1), terms, int(chunk), dtype)
    with torch.no_grad():
        return _LinearKD.forward(None, h, weight, th, t_weight, labels.reshape(-1), terms, int(chunk), dtype)


class _LinearKD(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, th, t_weight, labels, terms, chunk, dtype):
        grads = ctx is not None
        tw = t_weight.to(dtype)

        def chunk_loss(rows, logits):
            return _chunk(logits, th[rows].to(dtype) @ tw.t(), labels[rows], terms, grads)

        need = ctx.needs_input_grad[:2] if grads else (False, False)
        total, dh, dw = accumulate(h, weight, chunk, dtype, chunk_loss, *need)
        if grads:
            save_grads(ctx, dh, dw, weight)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        return stored_grads(ctx, grad_out, 8)


def _chunk(s: torch.Tensor, t: torch.Tensor, y: torch.Tensor, terms: tuple, grads: bool):
    """Loss sum of one chunk from its student logits `s` and teacher logits `t` `[n, V]`, and
    d(loss)/d(s) in the wide dtype (None without gradients)."""
    kl_w, ce_w, tau = terms
    wide = wide_dtype(s.dtype)
    s, t = s.to(wide), t.to(wide)
    valid = y != IGNORE
    loss = torch.zeros((), dtype=wide, device=s.device)
    log_qs = torch.log_softmax(s / tau, dim=-1)
    log_qt = torch.log_softmax(t / tau, dim=-1)
    if kl_w:
        kl = (log_qt.exp() * (log_qt - log_qs)).sum(-1)  # [n]
        loss = loss + kl_w * tau**2 * kl[valid].sum()
    if ce_w:
        loss = loss + ce_w * F.cross_entropy(s, y, ignore_index=IGNORE, reduction="sum")
    if not grads:
        return loss, None
    g = kl_w * tau * (log_qs.exp() - log_qt.exp())
    if ce_w:
        ce = torch.softmax(s, dim=-1)
        ce[valid, y[valid]] -= 1.0
        g = g + ce_w * ce
    g[~valid] = 0.0
    return loss, g
