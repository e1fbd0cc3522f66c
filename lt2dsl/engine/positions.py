"""`Positions`: the per-row positions of one decode step through a `StaticCache`, and the ops that
read them (the `RowPositions` contract of `lowering/cache.py`).

Each row b has seen t_b tokens; its new token sits at position t_b and, once written, its keys fill
slots 0..t_b (a ring: the slots of the last R positions). Every op here takes its shapes from the
static buffers and its positions from `t` on the device, so a step reads no host position.
"""

from __future__ import annotations

import torch

from lt2dsl.engine.sparse import nsa_rows
from lt2dsl.kernels import fused
from lt2dsl.kernels.attention import attention_decode
from lt2dsl.kernels.common.attn_utils import compute_dtype, topk_select
from lt2dsl.kernels.common.backend import pick_backend
from lt2dsl.kernels.dsa import dsa
from lt2dsl.kernels.dsa.reference import indexer_scores
from lt2dsl.lowering.cache import RowPositions
from lt2dsl.lowering.functional import rope_rows
from lt2dsl.lowering.functional_recurrent import xpos_angles


class Positions(RowPositions):
    """Positions `t [B]` (int64, the cache's own tensor, updated in place) below `limit`.

    RoPE rows and xPos angles come from tables of `limit` positions built on first use and kept
    here (a captured step reads their memory, so they live as long as the cache). Within one step
    the rows gathered for a (head dim, θ, dtype, scaling), the attention lengths and DSA's mask of
    valid slots are shared by every layer; `fresh()` starts a step.
    """

    def __init__(self, t: torch.Tensor, limit: int):
        self.t, self.limit = t, limit
        self._tables: dict = {}
        self._step: dict = {}

    def fresh(self) -> Positions:
        self._step.clear()
        return self

    def rows(self) -> torch.Tensor:
        return self.t

    def rope_rows(self, d: int, theta: float, dt: torch.dtype, scaling=None) -> tuple:
        """(c, s) `[B, d]` of `rope_rows` at each row's position."""
        key = (d, theta, dt, scaling)
        if key not in self._step:
            if key not in self._tables:
                with torch.inference_mode(False), torch.no_grad():
                    grid = torch.arange(self.limit, device=self.t.device)
                    self._tables[key] = rope_rows(d, theta, grid, dt, scaling)
            c, s = (tab.index_select(0, self.t) for tab in self._tables[key])
            self._step[key] = (c, s)
        return self._step[key]

    def xpos(self, xs: tuple, backend: str) -> tuple:
        """The rows' angles gathered from a table of `limit` positions (`xpos_angles`, built on
        first use and kept, as the RoPE table), in the rotation's kernel."""
        x = xs[0]
        K, dt = x.shape[-1], torch.float64 if x.dtype == torch.float64 else torch.float32
        key = ("xpos", K, dt)
        if key not in self._tables:
            with torch.inference_mode(False), torch.no_grad():
                self._tables[key] = xpos_angles(K, torch.arange(self.limit, device=self.t.device), dt)
        cos, sin = self._tables[key]
        T = x.shape[1]
        at = self.t[:, None] if T == 1 else self.t[:, None] + torch.arange(T, device=x.device)
        return fused.xpos(xs, cos, sin, at, backend=backend)

    def _per_step(self, key: tuple, make):
        """`make()`, computed once per step and shared by every layer that asks for `key`."""
        if key not in self._step:
            self._step[key] = make()
        return self._step[key]

    def attention(self, q, k, v, window, gate, backend: str) -> torch.Tensor:
        """Flash-decoding over the buffers: slot j of row b holds position j (a ring for a window)."""
        Tq = q.shape[1]
        # int32, the kernel's index type: no cast per layer
        seqlens = self._per_step(("seqlens", Tq), lambda: (self.t + Tq).to(torch.int32))
        return attention_decode(
            q, k, v, seqlens, window=window, ring=window is not None, gate=gate, backend=backend
        )

    def dsa(
        self, q, k, v, q_idx, k_idx, w_idx, topk: int, idx_scale: float, backend: str, w_scale: float = 1.0
    ) -> torch.Tensor:
        """The indexer's top-k over each row's keys 0..t_b (ties to the lower index, −1 pads, as
        `dsa_indexer`), then the sparse attention over the buffers with that selection. On the
        Triton path the selection is the same set in index order (what the cache-less forward's
        sparse attention takes), scored and selected in two launches, `w_scale` applied in the
        scoring kernel."""
        if pick_backend(backend, q_idx) == "triton":
            from lt2dsl.kernels.dsa.triton_indexer import dsa_indexer_triton  # imports Triton

            chosen = dsa_indexer_triton(
                q_idx, k_idx, w_idx, topk=topk, idx_scale=idx_scale, ordered=False, positions=self.t,
                w_scale=w_scale,
            )  # fmt: skip
            return dsa(q, k, v, None, None, topk=topk, indices=chosen, backend=backend)
        L = k.shape[1]
        w_idx = w_idx * w_scale if w_scale != 1.0 else w_idx
        scores = indexer_scores(q_idx, k_idx, w_idx, idx_scale, compute_dtype(q_idx, k_idx, w_idx))
        valid = self._per_step(
            ("valid", L), lambda: torch.arange(L, device=q.device)[None, None, :] <= self.t[:, None, None]
        )
        chosen = topk_select(scores, valid, topk)  # [B, 1, topk]
        return dsa(q, k, v, None, None, topk=topk, indices=chosen, backend=backend)

    def nsa(self, q, k, v, g, k_cmp, v_cmp, geometry: dict, backend: str) -> torch.Tensor:
        """NSA of each row's query at t_b: on the Triton path the decode kernels, which read only
        the keys a row sees (`kernels.nsa.triton_decode`), else the dense masked reference
        (`engine.sparse.nsa_rows`)."""
        if pick_backend(backend, q) == "triton":
            from lt2dsl.kernels.nsa.triton_decode import nsa_decode_triton  # imports Triton

            return nsa_decode_triton(q, k, v, g, k_cmp, v_cmp, self.t, geometry, gate_logits=True)
        return nsa_rows(q, k, v, torch.sigmoid(g), k_cmp, v_cmp, self.t, geometry)
