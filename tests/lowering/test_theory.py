"""The research's theory holds on the lowered modules (mixers.md §15).

* §15.2: a block of N sliding-window layers (window w, keys t − w + 1 … t) looped T times sees
  exactly N·T·(w − 1) + 1 tokens: the autograd Jacobian ∂logits_i/∂e_j is non-zero iff
  0 ≤ i − j ≤ N·T·(w − 1) — and the estimate reports the same figure.
* §15.1: the transition of the delta rule as the lowered ops compute it (state evolved from I
  with v = 0) is the product of generalized Householder factors, and its rank statements hold:
  P1–P3 for `delta_rule`, P4 for `gated_delta_rule` (scalar decay) and `kda` (diagonal decay).
"""

from __future__ import annotations

import pytest
import torch

from lt2dsl.cost.estimate import estimate
from lt2dsl.kernels.delta import delta_rule, gated_delta_rule, kda

from .util import lower, tokens

# ---- §15.2 receptive field --------------------------------------------------------------------


def jacobian_support(model, ids: torch.Tensor, i: int) -> list[int]:
    """Positions j whose embedding moves logits at position i (exactly non-zero gradient)."""
    captured = []
    hook = model.embed.register_forward_hook(lambda m, a, out: captured.append(out))
    try:
        logits = model(ids)
    finally:
        hook.remove()
    (grad,) = torch.autograd.grad(logits[0, i].sum(), captured[0])
    return torch.nonzero(grad[0].abs().sum(-1)).flatten().tolist()


@pytest.mark.parametrize(("N", "T", "w"), [(2, 3, 3), (1, 4, 4), (3, 1, 5)])
def test_looped_sliding_window_receptive_field(N, T, w):
    body = "; ".join([f"swa(window={w})"] * N)
    model = lower(f"loop T={T} < {body} >")
    look = N * T * (w - 1)
    L = look + 8
    ids = tokens(1, L)
    for i in (L - 1, look, 3):
        assert jacobian_support(model, ids, i) == list(range(max(0, i - look), i + 1))
    assert estimate(model.ir).theory.receptive_field == look + 1


def test_a_full_attention_layer_makes_the_field_unbounded():
    model = lower("loop T=2 < swa(window=2); full >")
    ids = tokens(1, 12)
    assert jacobian_support(model, ids, 11) == list(range(12))
    assert estimate(model.ir).theory.receptive_field is None


# ---- §15.1 products of generalized Householder factors ----------------------------------------


def unit(x: torch.Tensor) -> torch.Tensor:
    """Exact unit rows (no eps: fla's L2Norm eps would make ‖k‖ < 1)."""
    return x / x.norm(dim=-1, keepdim=True)


def transition(keys: torch.Tensor, beta: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
    """P = the state after T tokens from S_0 = I with v = 0, as the lowered op computes it.

    keys `[T, d]` unit rows, beta `[T]`; g: None (delta rule), `[T]` (GDN log decay) or `[T, d]`
    (KDA per-channel log decay). Returns P `[d, d]` (float64).
    """
    T, d = keys.shape
    q, k = torch.randn(1, T, 1, d, dtype=torch.float64), keys[None, :, None, :]
    v = torch.zeros(1, T, 1, d, dtype=torch.float64)
    b, S0 = beta[None, :, None], torch.eye(d, dtype=torch.float64)[None, None]
    kw = dict(initial_state=S0, output_final_state=True, backend="reference")
    if g is None:
        _, S = delta_rule(q, k, v, b, **kw)
    elif g.dim() == 1:
        _, S = gated_delta_rule(q, k, v, g[None, :, None], b, **kw)
    else:
        _, S = kda(q, k, v, g[None, :, None, :], b, **kw)
    return S[0, 0]


def householder_product(keys, beta, decay=None) -> torch.Tensor:
    """H_T ⋯ H_1 (each H = I − β k kᵀ, after Diag(α) for KDA / times α for GDN), written out."""
    d = keys.shape[1]
    P = torch.eye(d, dtype=torch.float64)
    for t in range(keys.shape[0]):
        H = torch.eye(d, dtype=torch.float64) - beta[t] * torch.outer(keys[t], keys[t])
        if decay is not None:
            H = H @ torch.diag(decay[t]) if decay.dim() == 2 else H * decay[t]
        P = H @ P
    return P


def rank(M: torch.Tensor, tol: float = 1e-9) -> int:
    """Numerical rank with an absolute tolerance (mixers.md §15.1: relative fails near zero)."""
    return int((torch.linalg.svdvals(M) > tol).sum())


I8 = torch.eye(8, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(3))
def test_delta_rule_transition_is_the_householder_product_of_rank_T(seed):
    torch.manual_seed(seed)
    for T in (1, 3, 5, 8, 11):
        keys = unit(torch.randn(T, 8, dtype=torch.float64))
        beta = torch.rand(T, dtype=torch.float64) * 1.8 + 0.1  # β ∈ (0.1, 1.9)
        P = transition(keys, beta)
        torch.testing.assert_close(P, householder_product(keys, beta), rtol=1e-10, atol=1e-12)
        assert rank(I8 - P) == min(T, 8)  # P1: generic keys
        assert torch.linalg.matrix_norm(P, ord=2) <= 1 + 1e-12  # P3


def test_keys_in_a_two_dimensional_span_give_rank_two():
    torch.manual_seed(3)
    k1, k2 = torch.randn(2, 8, dtype=torch.float64)
    keys = unit(torch.stack([k1, k2, k1 + k2, k1 - 2 * k2]))
    beta = torch.tensor([0.5, 1.2, 0.9, 1.7], dtype=torch.float64)
    assert rank(I8 - transition(keys, beta)) == 2


def test_orthonormal_keys_commute_and_erase_T_directions():
    torch.manual_seed(4)
    Q, _ = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64))
    keys, beta = Q[:, :3].T.contiguous(), torch.tensor([0.3, 1.0, 1.9], dtype=torch.float64)
    P = transition(keys, beta)
    want = I8 - sum(b * torch.outer(k, k) for b, k in zip(beta, keys))  # P2
    torch.testing.assert_close(P, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(P @ keys.T, keys.T * (1 - beta), rtol=1e-10, atol=1e-12)
    assert rank(I8 - P) == 3
    erase = transition(keys, torch.ones(3, dtype=torch.float64))  # β = 1: projector onto span(k)^⊥
    torch.testing.assert_close(erase @ erase, erase, rtol=1e-10, atol=1e-12)


def test_two_equal_reflections_cancel():
    k = unit(torch.randn(1, 8, dtype=torch.float64))
    P = transition(torch.cat([k, k]), torch.full((2,), 2.0, dtype=torch.float64))
    torch.testing.assert_close(P, I8, rtol=1e-10, atol=1e-12)


def test_gated_and_kda_transitions_keep_the_low_rank_update():
    torch.manual_seed(5)
    T = 3
    keys, beta = unit(torch.randn(T, 8, dtype=torch.float64)), torch.rand(T, dtype=torch.float64) + 0.5
    g = -torch.rand(T, dtype=torch.float64)  # GDN: P_GDN = (Π α) P
    P = transition(keys, beta, g)
    torch.testing.assert_close(P, g.sum().exp() * householder_product(keys, beta), rtol=1e-10, atol=1e-12)
    gk = -torch.rand(T, 8, dtype=torch.float64)  # KDA: rank(P − Π Diag(α)) ≤ T
    P = transition(keys, beta, gk)
    torch.testing.assert_close(P, householder_product(keys, beta, gk.exp()), rtol=1e-10, atol=1e-12)
    assert rank(P - torch.diag(gk.sum(0).exp())) <= T
