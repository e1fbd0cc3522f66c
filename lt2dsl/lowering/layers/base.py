"""The contract every mixer layer of the lowering follows.

A mixer layer is an `nn.Module` built from `(opts, cfg, backend)` — the resolved options of one
`Mixer` node, the `ModelConfig` and the kernel backend ("reference" | "triton" | "auto") — whose

* parameters are exactly the spec's `weights(opts, cfg)`: same names, same shapes (a test compares
  `named_parameters()` with the spec, so the estimate's parameter count is exact);
* `forward(x, entry, pos)` maps the normed block input `x [B, T, D]` to the mixer output
  `[B, T, D]` (before the residual add). `entry` is None (training / a forward without cache) or the
  layer's cache `Entry` (or `SubEntry` in a `par` block), which the layer reads and updates in
  place; `pos` is the absolute position of `x[:, 0]` (0 without cache); `cu_seqlens` (None, or
  `[N + 1]` document starts of a packed row `[1, T, D]`, never with an entry) makes every
  document a sequence of its own (`lt2dsl/lowering/packed.py`) and reaches every leaf that mixes
  over time;
* cache tensors it stores are exactly the spec's `cache(opts, cfg, B, L)` layout after L tokens:
  same names, shapes and dtypes (state dtype for recurrent states, the activation dtype for conv
  buffers and tmm inputs, the kv dtype — the activation dtype unless configured — for KV caches);
* forward code is `torch.fx`-traceable: control flow only on Python configuration, never on
  tensor values or on whether `entry` is None. Everything that touches the cache, and every mixer
  core, is a call of a `@leaf` function (`lowering/leaf.py`: one node in the traced graph), so the
  lowered graph shows projections, activations and norms as separate nodes the fusion pass can
  rewrite, and one node per core op.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from lt2dsl.dtypes import torch_dtype
from lt2dsl.ir.constraints import require
from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.registry import lookup
from lt2dsl.lowering.functional_recurrent import check_input, param_dtype


class MixerLayer(nn.Module):
    kind: ClassVar[str]

    def __init__(self, opts: dict[str, Any], cfg: ModelConfig, backend: str = "reference"):
        super().__init__()
        self.opts, self.cfg, self.backend = dict(opts), cfg, backend
        self.layer_kind = self.kind_of(self.opts)
        # the validator's shape rules and limits, asserted: a Model built in Python skips them
        require(self.layer_kind, self.opts, cfg)

    @classmethod
    def kind_of(cls, opts: dict[str, Any]) -> str:
        """The layer kind these options belong to (a class may serve several kinds)."""
        return cls.kind

    @property
    def spec(self):
        # Looked up, not stored: specs hold lambdas (option defaults), which would make
        # `torch.save(model)` fail to pickle the module.
        return lookup(self.layer_kind)

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        raise NotImplementedError

    def check(self, x) -> None:
        """`check_input` of this layer: `x` a floating `[B, T, D]` tensor of the parameters' dtype."""
        check_input(x, self.cfg.dim, param_dtype(self), self.kind)

    def head_projections(self, H: int, K: int, V: int) -> None:
        """Keep (H, K, V) and register q, k `D → H·K` and v `D → H·V`, in that order (the order of
        `named_parameters()` and of the initialisation)."""
        D = self.cfg.dim
        self.H, self.K, self.V = H, K, V
        self.q_proj, self.k_proj, self.v_proj = linear(D, H * K), linear(D, H * K), linear(D, H * V)

    def core_kwargs(self, cu_seqlens) -> dict[str, Any]:
        """What every recurrent core leaf takes besides its math: the kernel backend, the recurrent
        state's dtype and a packed row's document starts (or None)."""
        return {"backend": self.backend, "state_dtype": self.state_dtype(), "cu_seqlens": cu_seqlens}

    def state_dtype(self) -> torch.dtype:
        """Recurrent states: fp32 by default; float64 when the module runs in float64 (tests)."""
        p = next(self.parameters(), None)
        if p is not None and p.dtype == torch.float64:
            return torch.float64
        return torch_dtype(self.cfg.state_dtype)


def linear(n_in: int, n_out: int, bias: bool = False) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=bias)
