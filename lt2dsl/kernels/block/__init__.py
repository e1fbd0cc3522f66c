"""Whole-block decode kernels: one persistent launch for a block's decode step.

`gdn_block_decode` runs a GDN block (the hybrid example's: in-projection, q/k/v convs, gated delta
rule, fla's gated output norm, o_proj + residual, RMSNorm, SwiGLU MLP) for M ≤ 16 rows of one
token each: one row in one cooperative launch of #SMs programs with grid barriers between its six
phases (`triton_gdn_block.py`), more rows in six launches (faster there), where the unfused chain is
eleven launches; `naive.gdn_block_decode_ref` is that chain. No autograd, decode only: the engine's
step.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..common import grid_sync
from .naive import gdn_block_decode_ref

__all__ = ["CONFIGS", "MAX_M", "Config", "gdn_block_decode", "gdn_block_decode_ref"]

MAX_M = 16  # the decode rows one launch takes (the products' tl.dot tile)
WARPS = 8  # every phase's (no autotuning: a persistent grid's programs must all be resident)
STAGES = 3  # the launch's pipeline depth: the loops outside the products (theirs are per config)


class Config(NamedTuple):
    """The products' tiles: the wide ones (in-projection, gate/up: N ≥ 5632 outputs) and the
    narrow ones (o_proj, down: N = D) each with their own BN outputs × BK inputs a tile and
    pipeline stages; `flat`, one loop over a program's (tile, K tile) pairs."""

    bn_wide: int
    bk_wide: int
    stages_wide: int
    bn_narrow: int
    bk_narrow: int
    stages_narrow: int
    flat: bool = False


# compiled for sm_90 (`aot_jobs`); the first is the default. The decode GEMV's autotuning on the
# H100 picked BN 64 × BK 128 (3 stages) for the wide products and BN 16 × BK 256-512 for the
# narrow ones; on the hybrid's block (H100, bench/decode_stream.py) the one launch took
# 79.8 µs at M = 1 with the first, 79.4 flat, 83.2-93.9 with the next three and 120.4 with one
# 16 × 256 tile for every phase (the last)
CONFIGS = (
    Config(64, 128, 3, 16, 512, 4),
    Config(64, 128, 3, 16, 512, 4, True),
    Config(64, 128, 3, 16, 256, 6),
    Config(32, 128, 4, 16, 256, 6),
    Config(64, 64, 4, 16, 256, 6),
    Config(16, 256, 3, 16, 256, 3),
)


def barrier_counter(device: torch.device, programs: int) -> Tensor:
    """The grid-barrier counter of persistent launches of `programs` programs on `device`: each
    adds 5 · programs (`common.grid_sync`). Made before a CUDA graph captures a launch."""
    return grid_sync.barrier_counter(device, programs, 5)


def kernel_tiles(cfg: Config) -> dict:
    """The kernel's constexprs of a config."""
    return dict(BNW=cfg.bn_wide, BKW=cfg.bk_wide, SW=cfg.stages_wide, BNN=cfg.bn_narrow, BKN=cfg.bk_narrow,
                SN=cfg.stages_narrow, FLAT=cfg.flat)  # fmt: skip


def _check(name: str, t: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise ValueError(f"gdn_block_decode: {name} must be {dtype} of shape {list(shape)}, "
                         f"got {t.dtype} {list(t.shape)}")  # fmt: skip


def gdn_block_decode(
    xn: Tensor, res: Tensor, w_in: Tensor, offsets: tuple[int, ...], conv_weights, conv_biases, hists,
    A_log: Tensor, dt_bias: Tensor, state: Tensor, gamma_o: Tensor, w_o: Tensor, gamma2: Tensor,
    w_gu: Tensor, w_down: Tensor, *, heads: int, scale: float, beta_scale: float, eps_o: float, eps2: float,
    persistent: bool | None = None, programs: int | None = None, config: Config | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """One decode token per row through a GDN block; (h2, y) as `gdn_block_decode_ref` returns.

    Args:
        xn: `[M, D]` the block's normed input; res `[M, D]` the residual stream (16-bit, one dtype).
        w_in: `[N_in, D]` the concatenated in-projection; offsets: the columns of its output where
            q `[H·K]`, k `[H·K]`, v `[HV·V]`, z `[HV·V]`, a `[HV]` and b `[HV]` start.
        conv_weights, conv_biases, hists: q, k, v convs `[C, 1, W]`, `[C]` or None, histories
            `[M, C, W−1]` (x's dtype, unit time stride), shifted in place.
        A_log, dt_bias: `[HV]`; state: `[M, HV, K, V]` fp32 contiguous, updated in place.
        gamma_o: the gated norm's `[V]`; w_o `[D, HV·V]`; gamma2 `[D]` the MLP's norm;
        w_gu `[2·F (+ padding), D]` gate rows then up rows; w_down `[D, F]`.
        persistent: one launch through grid barriers (default on a GPU for one row) or six launches
            (default for more rows: on the H100 at M = 8 the one launch took 120.6 µs, the six 95.9,
            its one program an SM too few for the recurrence's 1,024 items; and under the CPU
            interpreter, where a grid barrier cannot be waited for).
        programs: the grid of every launch, each program taking items p, p + P, … of each phase
            (default: the card's SMs for the persistent launch, which must all be resident at once,
            so never more; one program an item for the six launches).
        config: the products' tiles, one of `CONFIGS` (default the first).
    """
    import triton

    from lt2dsl.kernels.common.backend import triton_interpreting

    from .triton_gdn_block import gdn_block_kernel

    M, D = xn.shape
    Mh, HV, K, V = state.shape
    dt = xn.dtype
    if not 1 <= M <= MAX_M or dt not in (torch.bfloat16, torch.float16) or Mh != M:
        raise ValueError(
            f"gdn_block_decode: xn must be [M, D] 16-bit with 1 ≤ M ≤ {MAX_M} rows and the state "
            f"[M, HV, K, V]; got xn {xn.dtype} {list(xn.shape)}, state {list(state.shape)}"
        )
    F_ = w_down.shape[1]
    n_in = w_in.shape[0]
    H = heads
    _check("res", res, (M, D), dt)
    _check("w_in", w_in, (n_in, D), dt)
    _check("state", state, (M, HV, K, V), torch.float32)
    _check("w_o", w_o, (D, HV * V), dt)
    _check("gamma2", gamma2, (D,), gamma2.dtype)
    _check("w_gu", w_gu, (max(w_gu.shape[0], 2 * F_), D), dt)  # gate rows, up rows[, padding]
    _check("w_down", w_down, (D, F_), dt)
    q0, k0, v0, z0, a0, b0 = offsets
    ends = {"q": q0 + H * K, "k": k0 + H * K, "v": v0 + HV * V, "z": z0 + HV * V, "a": a0 + HV, "b": b0 + HV}
    if max(ends.values()) > n_in or min(offsets) < 0:
        raise ValueError(f"gdn_block_decode: offsets {offsets} place columns past w_in's {n_in} outputs")
    for t, name in (
        (xn, "xn"),
        (res, "res"),
        (w_in, "w_in"),
        (w_o, "w_o"),
        (w_gu, "w_gu"),
        (w_down, "w_down"),
    ):
        if t.stride(-1) != 1:
            raise ValueError(f"gdn_block_decode: {name} needs a unit last stride")
    if not state.is_contiguous():
        raise ValueError("gdn_block_decode: state must be contiguous")
    W = conv_weights[0].shape[-1]
    w2 = [w.reshape(w.shape[0], W).contiguous() for w in conv_weights]
    bias = [w if b is None else b for b, w in zip(conv_biases, w2)]
    hq, hk, hv = hists
    dev = xn.device
    y1 = torch.empty(M, n_in, device=dev, dtype=dt)
    o = torch.empty(M, HV * V, device=dev, dtype=dt)
    on = torch.empty(M, HV * V, device=dev, dtype=gamma_o.dtype)
    h2 = torch.empty(M, D, device=dev, dtype=dt)
    act = torch.empty(M, F_, device=dev, dtype=dt)
    y = torch.empty(M, D, device=dev, dtype=dt)
    cfg = Config(*config) if config is not None else CONFIGS[0]
    if cfg not in CONFIGS:
        raise ValueError(f"gdn_block_decode: config must be one of {CONFIGS}, got {config}")
    if persistent is None:
        persistent = dev.type == "cuda" and not triton_interpreting() and M == 1
    BV = min(32, triton.next_power_of_2(V))
    NV = triton.cdiv(V, BV)
    tiles = {1: (n_in, cfg.bn_wide), 4: (D, cfg.bn_narrow), 5: (F_, cfg.bn_wide), 6: (D, cfg.bn_narrow)}
    grids = {p: triton.cdiv(n, bn) for p, (n, bn) in tiles.items()} | {2: NV * M * HV, 3: M * HV}
    phases = [0] if persistent else sorted(grids)
    if persistent and programs is None:
        programs = torch.cuda.get_device_properties(dev).multi_processor_count
    bar = barrier_counter(dev, programs or 0)
    # the one launch's programs wait for each other: a cooperative launch fails where they could not
    # all be resident (a card shared through MPS with an SM limit) instead of hanging
    coop = {"launch_cooperative_grid": True} if persistent and not triton_interpreting() else {}
    for phase in phases:
        grid = (programs,) if programs is not None else (grids[phase],)
        gdn_block_kernel[grid](
            xn, res, w_in, y1, hq, hk, hv, *w2, *bias, A_log, dt_bias, state, o, gamma_o, on, w_o, h2, gamma2,
            w_gu, act, w_down, y, bar,
            M, D, n_in, F_, xn.stride(0), res.stride(0), q0, k0, v0, z0, a0, b0,
            hq.stride(0), hk.stride(0), hv.stride(0), hq.stride(1), hk.stride(1), hv.stride(1),
            scale, beta_scale, eps_o, eps2,
            PHASE=phase, H=H, HV=HV, K=K, V=V, BKH=triton.next_power_of_2(K), BV=BV,
            BVF=triton.next_power_of_2(V), W=W, WP=triton.next_power_of_2(W - 1),
            HAS_BQ=conv_biases[0] is not None, HAS_BK=conv_biases[1] is not None,
            HAS_BV=conv_biases[2] is not None, BM=MAX_M, **kernel_tiles(cfg), num_warps=WARPS,
            num_stages=STAGES, **coop,
        )  # fmt: skip
    return h2, y
