"""GDN decode from the raw gate projections: the gates formed inside the recurrent kernel.

    g = −exp(A_log) · softplus(a + dt_bias),  β = s · σ(b)        (mixers.md §5(a), fp32)
    S ← e^g S,  u = β (v − Sᵀk),  S ← S + k uᵀ,  o = Sᵀ (scale · q)   (§5(b))

`gdn_decode_gates` is `fused.gdn_gate` followed by `gated_delta_rule(..., inplace_final_state=True)`
in one call: on the Triton path one launch of `recurrent.delta_recurrent_kernel` (GATE 3) instead
of two, the state `[N, HV, K, V]` fp32 updated in place. `gdn_decode_gates_ref` is the two-step
PyTorch form every test compares with. Inference only (no autograd).
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.custom_op import custom_op
from lt2dsl.kernels.delta.ops import RECURRENT_MAX_T, _recurrent

Tensor = torch.Tensor
GATE_RAW = 3  # `recurrent.delta_recurrent_kernel`'s GATE for raw GDN gates


def gdn_decode_gates_ref(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, state: Tensor,
    *, beta_scale: float = 1.0, scale: float | None = None, use_qk_l2norm_in_kernel: bool = False,
) -> Tensor:  # fmt: skip
    """The gates (`fused.naive.gdn_gate_ref`, in the state's dtype), then the delta-rule recurrence
    from `state`, written back into it. Shapes as `gdn_decode_gates`; returns o `[B, T, HV, V]`."""
    from lt2dsl.kernels.delta import gated_delta_rule
    from lt2dsl.kernels.fused.naive import gdn_gate_ref

    g, beta = gdn_gate_ref(a, b, A_log, dt_bias, beta_scale, state.dtype)
    o, _ = gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=state, inplace_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, backend="reference",
    )  # fmt: skip
    return o


def _rows(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """a, b `[B, T, HV]` as `[B·T, HV]` rows of unit column stride and one row stride shared by
    both: views where they are (column slices of one contiguous projection output), else copies."""
    HV = a.shape[-1]
    a2, b2 = a.reshape(-1, HV), b.reshape(-1, HV)
    if a2.stride(-1) != 1 or b2.stride(-1) != 1 or a2.stride(0) != b2.stride(0):
        a2, b2 = a2.contiguous(), b2.contiguous()
    return a2, b2


def _gates_inplace_impl(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, state: Tensor,
    beta_scale: float, scale: float, l2norm_qk: bool,
) -> Tensor:  # fmt: skip
    a2, b2 = _rows(a, b)
    raw = (A_log, dt_bias, a2.stride(0), beta_scale)
    return _recurrent(q, k, v, a2, b2, state, state, None, GATE_RAW, scale, l2norm_qk, raw)


gdn_recurrent_gates_inplace = custom_op(
    "lt2dsl::gdn_recurrent_gates_inplace", _gates_inplace_impl, mutates_args=("state",)
)


@gdn_recurrent_gates_inplace.register_fake
def _(q, k, v, a, b, A_log, dt_bias, state, beta_scale, scale, l2norm_qk):
    return torch.empty_like(v)


def gates_in_kernel(q: Tensor, a: Tensor, state: Tensor | None, backend: str) -> bool:
    """Whether `gdn_decode_gates` takes the one-launch kernel: the Triton backend for q, a few tokens
    (the recurrent path's), an fp32 contiguous state, and no gradient to track."""
    from lt2dsl.kernels.delta import pick_backend

    if state is None or state.dtype != torch.float32 or not state.is_contiguous():
        return False
    if q.shape[1] > RECURRENT_MAX_T or a.shape[1] != q.shape[1] or pick_backend(backend, q) != "triton":
        return False
    return not torch.is_grad_enabled()


def gdn_decode_gates(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, state: Tensor,
    *, beta_scale: float = 1.0, scale: float | None = None, use_qk_l2norm_in_kernel: bool = False,
    gate_dtype: torch.dtype | None = None, backend: str = "auto",
) -> Tensor:  # fmt: skip
    """GDN decode of a few tokens from the raw gate projections, the state updated in place.

    Args:
        q, k (Tensor): `[B, T, H, K]`; v `[B, T, HV, V]` (HV a multiple of H).
        a, b (Tensor): `[B, T, HV]` raw gate projections (column slices of a wider output are read
            in place).
        A_log, dt_bias (Tensor): `[HV]`.
        state (Tensor): `[B, HV, K, V]`, read and overwritten with the final state.
        beta_scale (float, Optional): s of β = s · σ(b) (2 with negative eigenvalues). Default: `1.0`.
        scale (float, Optional): multiplied into q. Default: `K ** -0.5`.
        use_qk_l2norm_in_kernel (bool, Optional): L2-normalise q and k first. Default: `False`.
        gate_dtype (torch.dtype, Optional): the dtype g and β are formed in; the kernel forms them
            in fp32. Default: float64 for a float64 state, else fp32.
        backend (str, Optional): "triton", "reference" or "auto". Default: `"auto"`.

    Returns:
        Tensor: o `[B, T, HV, V]` in v's dtype.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if gate_dtype is None:
        gate_dtype = torch.float64 if state.dtype == torch.float64 else torch.float32
    if gate_dtype == torch.float32 and gates_in_kernel(q, a, state, backend):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return gdn_recurrent_gates_inplace(
            q, k, v, a, b, A_log, dt_bias, state, float(beta_scale), scale, use_qk_l2norm_in_kernel
        )
    from lt2dsl.kernels import fused
    from lt2dsl.kernels.delta import gated_delta_rule

    g, beta = fused.gdn_gate(a, b, A_log, dt_bias, beta_scale=beta_scale, dtype=gate_dtype, backend=backend)
    o, _ = gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=state, inplace_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, backend=backend,
    )  # fmt: skip
    return o
