"""The delta-rule family: DeltaNet (`delta_rule`), Gated DeltaNet (`gated_delta_rule`) and KDA (`kda`).

    DeltaNet  S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ                      (mixers.md §4)
    GDN       S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, α_t = e^{g_t}    (§5)
    KDA       S_t = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t−1} + β_t k_t v_tᵀ             (§6)

The three ops share one implementation; the gate is a compile-time switch of the kernels. `naive.py`
is the recurrent truth, `chunk_ref.py` the chunked PyTorch form (`backend="reference"`), the Triton
kernels are the rest of this folder (README.md).
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.backend import resolve_backend
from lt2dsl.kernels.common.norm import l2norm
from lt2dsl.kernels.delta.args import check_delta_args
from lt2dsl.kernels.delta.chunk_ref import delta_chunk_ref
from lt2dsl.kernels.delta.recipe import RECIPES, DeltaRecipe, check_recipe_arg, default_recipe

TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


MAX_TRITON_K = 256  # widest key head the Triton kernels tile (validation warns with W0401)


def pick_backend(backend: str, q: torch.Tensor) -> str:
    """ "reference" or "triton". float64 and key heads wider than 256 have no Triton kernel:
    "auto" falls back to the reference, "triton" refuses."""
    which = resolve_backend(backend, q, has_triton=True)
    if which == "triton" and (q.dtype not in TRITON_DTYPES or q.shape[-1] > MAX_TRITON_K):
        if backend == "auto":
            return "reference"
        raise ValueError(
            f"backend='triton' supports {TRITON_DTYPES} and key head dims ≤ {MAX_TRITON_K}, "
            f"got {q.dtype} with K={q.shape[-1]}; use 'reference'"
        )
    return which


def run_delta(
    gate: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, beta: torch.Tensor,
    *, scale: float | None = None, initial_state: torch.Tensor | None = None,
    output_final_state: bool = False, inplace_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None, use_qk_l2norm_in_kernel: bool = False, backend: str = "reference",
    recipe: DeltaRecipe | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """One op of the family (`gate`: "none", "scalar", "channel"): check the arguments, run the
    chosen backend, honour `inplace_final_state`. The keywords are the public ops' (see `_DOC`)."""
    dims = check_delta_args(q, k, v, g, beta, gate, initial_state, cu_seqlens, inplace_final_state)
    check_recipe_arg(recipe)
    scale = dims.K**-0.5 if scale is None else float(scale)
    want_state = output_final_state or inplace_final_state
    which = pick_backend(backend, q)
    if which == "triton":
        from lt2dsl.kernels.delta.ops import delta_triton

        o, S = delta_triton(
            gate,
            q,
            k,
            v,
            g,
            beta,
            scale,
            initial_state,
            want_state,
            inplace_final_state,
            cu_seqlens,
            use_qk_l2norm_in_kernel,
            recipe,
        )
        return o, S
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    o, S = delta_chunk_ref(
        q,
        k,
        v,
        g,
        beta,
        gate=gate,
        scale=scale,
        initial_state=initial_state,
        output_final_state=want_state,
        cu_seqlens=cu_seqlens,
    )
    if inplace_final_state:
        with torch.no_grad():
            initial_state.copy_(S)
        S = initial_state
    return o, S


_DOC = """{title} over `[B, T, H, D]` tensors (the peer's conventions).

    Args:
        q (Tensor): `[B, T, H, K]` queries; k likewise (L2-normalised keys keep it stable).
        v (Tensor): `[B, T, HV, V]` values, HV a multiple of H (value head j reads q/k head
            j // (HV/H)).{gate}
        beta (Tensor): `[B, T, HV]` write strength (σ(·) of a projection, computed by the layer).
        scale (float, Optional): multiplied into q.
            Default: `K ** -0.5`.
        initial_state (Tensor, Optional): `[N, HV, K, V]` state to start from (fp32).
        output_final_state (bool, Optional): also return the final state.
            Default: `False`.
        inplace_final_state (bool, Optional): write the final state into `initial_state` and return
            that same tensor (decode without allocation).
            Default: `False`.
        cu_seqlens (LongTensor, Optional): `[N + 1]` packed variable-length sequences (B == 1).
        use_qk_l2norm_in_kernel (bool, Optional): L2-normalise q and k first (eps 1e-6).
            Default: `False`.
        backend (str, Optional): "reference", "triton" or "auto".
            Default: `"reference"`.
        recipe (DeltaRecipe | str, Optional): the Triton kernels' forms (`recipe.py`): a
            `DeltaRecipe`, or a name of `RECIPES` ("default", "fused", "split").
            Default: `default_recipe` of the call's sizes, dtype and GPU.

    Returns:
        o `[B, T, HV, V]` (dtype of v) and the final state `[N, HV, K, V]` fp32 (None unless asked).
    """


__all__ = ["RECIPES", "DeltaRecipe", "default_recipe", "delta_rule", "gated_delta_rule", "kda"]


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, **kw):
    return run_delta("none", q, k, v, None, beta, **kw)


def gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, **kw
):
    return run_delta("scalar", q, k, v, g, beta, **kw)


def kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, **kw):
    return run_delta("channel", q, k, v, g, beta, **kw)


delta_rule.__doc__ = _DOC.format(title="Delta rule (DeltaNet)", gate="")
gated_delta_rule.__doc__ = _DOC.format(
    title="Gated delta rule (GDN)",
    gate="\n        g (Tensor): `[B, T, HV]` log decay (≤ 0), used in fp32; α = exp(g).",
)
kda.__doc__ = _DOC.format(
    title="Kimi delta attention (KDA)",
    gate="\n        g (Tensor): `[B, T, HV, K]` per-channel log decay (≤ 0), used in fp32.",
)
