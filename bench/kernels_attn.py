"""GPU benchmark of the attention family: `attention` (gated full, sliding window), `dsa`, `nsa`, decode.

Next to torch SDPA (flash backend), flex attention with a sliding-window block mask, and the peer
(fla `parallel_attn`, `parallel_nsa`, the DSA reference `naive_dsa`) when importable, in one run.
Training shapes: B=4, H=16, D=128, bf16, T ∈ {8192, 32768} (`T=` env to override, e.g. T=8192);
decode: one query over a 4k–128k cache at batch 1 and 8.

Usage: `PYTHONPATH=. OUT=$OUT python bench/kernels_attn.py` (writes $OUT/kernels_attn.json); the lead's
driver imports `cases()`. Selection: `ONLY=substring,substring` keeps matching groups.
"""

from __future__ import annotations

import os

import torch

from bench import harness
from bench.harness import Case

DEV, DT = "cuda", torch.bfloat16
B, H, D = 4, 16, 128
HI, DI, TOPK = 4, 128, 2048  # DSA indexer: few heads (issue 6), DeepSeek's index dim and top-k
NSA = dict(block_counts=16, block_size=64, window_size=512)


def _rnd(*shape, grad=True, scale=1.0):
    x = (torch.randn(*shape, device=DEV, dtype=torch.float32) * scale).to(DT)
    return x.requires_grad_(grad)


def _causal_flops(T: int, window: int | None = None) -> float:
    """Forward FLOPs of causal attention: 4·D per visible (query, key) pair and head."""
    pairs = T * (T + 1) / 2 if window is None else window * T - window * (window - 1) / 2
    return 4 * B * H * D * pairs


def _case(group, impl, make, flops, backward):
    return Case(
        group=group,
        impl=impl,
        make=make,
        backward=backward,
        flops=None if flops is None else flops * (3.5 if backward else 1.0),
    )


def _full_cases(T: int) -> list[Case]:
    from lt2dsl.kernels.attention import attention

    def ours(gate, recipe=""):
        def make():
            q, k, v = _rnd(B, T, H, D), _rnd(B, T, H, D), _rnd(B, T, H, D)
            g = _rnd(B, T, H, D) if gate else None
            leaves = [q, k, v] + ([g] if gate else [])

            def fn():
                return attention(q, k, v, gate=g, backend="triton", recipe=recipe)

            return fn, leaves

        return make

    def sdpa():
        q, k, v = _rnd(B, H, T, D), _rnd(B, H, T, D), _rnd(B, H, T, D)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def fn():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        return fn, [q, k, v]

    def sdpa_default():
        # the backend torch picks itself (the peer README's 7.3 ms fwd+bwd reading is this one)
        q, k, v = _rnd(B, H, T, D), _rnd(B, H, T, D), _rnd(B, H, T, D)
        return (lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)), [q, k, v]

    def peer():
        from fla.ops.attn import parallel_attn

        q, k, v = _rnd(B, T, H, D), _rnd(B, T, H, D), _rnd(B, T, H, D)
        return (lambda: parallel_attn(q, k, v)), [q, k, v]

    group, fl = f"attn full T={T}", _causal_flops(T)
    return [
        _case(group, impl, mk, fl, bw)
        for bw in (False, True)
        for impl, mk in (
            ("lt2dsl+gate", ours(True)),
            ("lt2dsl+gate-split", ours(True, "split")),
            ("lt2dsl", ours(False)),
            ("sdpa", sdpa),
            ("sdpa-default", sdpa_default),
            ("fla", peer),
        )
    ]


def _swa_cases(T: int, w: int = 512) -> list[Case]:
    from lt2dsl.kernels.attention import attention

    def ours():
        q, k, v = _rnd(B, T, H, D), _rnd(B, T, H, D), _rnd(B, T, H, D)
        return (lambda: attention(q, k, v, window=w, backend="triton")), [q, k, v]

    def flex():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        bm = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki < w), None, None, T, T, device=DEV)
        f = torch.compile(flex_attention)
        q, k, v = _rnd(B, H, T, D), _rnd(B, H, T, D), _rnd(B, H, T, D)
        return (lambda: f(q, k, v, block_mask=bm)), [q, k, v]

    def peer():
        from fla.ops.attn import parallel_attn

        q, k, v = _rnd(B, T, H, D), _rnd(B, T, H, D), _rnd(B, T, H, D)
        return (lambda: parallel_attn(q, k, v, window_size=w)), [q, k, v]

    group, fl = f"swa w={w} T={T}", _causal_flops(T, w)
    return [
        _case(group, impl, mk, fl, bw)
        for bw in (False, True)
        for impl, mk in (("lt2dsl", ours), ("flex", flex), ("fla", peer))
    ]


def _dsa_inputs(T: int):
    """MQA main attention (HKV = 1, as DSA's MLA runs) and a 4-head indexer."""
    q, k, v = _rnd(B, T, H, D), _rnd(B, T, 1, D), _rnd(B, T, 1, D)
    qi, ki = _rnd(B, T, HI, DI, grad=False), _rnd(B, T, DI, grad=False)
    wi = _rnd(B, T, HI, grad=False)
    return q, k, v, qi, ki, wi


def _dsa_cases(T: int) -> list[Case]:
    from lt2dsl.kernels.dsa import dsa, dsa_indexer

    def ours():
        q, k, v, qi, ki, wi = _dsa_inputs(T)
        return (lambda: dsa(q, k, v, qi, ki, wi, topk=TOPK, backend="triton")), [q, k, v]

    def ours_indexer(ordered=True):
        _, _, _, qi, ki, wi = _dsa_inputs(T)
        return (lambda: dsa_indexer(qi, ki, wi, topk=TOPK, backend="triton", ordered=ordered)), []

    def ours_fixed_selection():
        q, k, v, qi, ki, wi = _dsa_inputs(T)
        idx = dsa_indexer(qi, ki, wi, topk=TOPK, backend="triton")
        return (lambda: dsa(q, k, v, None, None, topk=TOPK, indices=idx, backend="triton")), [q, k, v]

    def sdpa_full():
        q, k, v = _rnd(B, H, T, D), _rnd(B, H, T, D), _rnd(B, H, T, D)
        return (lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)), [q, k, v]

    def peer():
        from fla.ops.dsa.naive import naive_dsa

        if T > 8192:
            raise RuntimeError("skipped: the peer's DSA reference is dense O(T²) per batch row")
        q, k, v, qi, ki, wi = _dsa_inputs(T)
        return (lambda: naive_dsa(q, k, v, qi, ki, wi, topk=TOPK)), [q, k, v]

    group = f"dsa k={TOPK} T={T}"
    sparse = 4 * B * H * D * T * TOPK
    cases = [_case(group, "lt2dsl", ours, sparse, bw) for bw in (False, True)]
    cases += [_case(group, "lt2dsl-attn", ours_fixed_selection, sparse, bw) for bw in (False, True)]
    cases += [Case(group=group, impl="lt2dsl-index", make=ours_indexer, flops=2 * B * HI * DI * T * T / 2)]
    # the selection as a set (the radix select: what the attention takes)
    cases += [
        Case(
            group=group,
            impl="lt2dsl-index-set",
            make=lambda: ours_indexer(ordered=False),
            flops=2 * B * HI * DI * T * T / 2,
        )
    ]
    cases += [_case(group, "sdpa-full", sdpa_full, _causal_flops(T), bw) for bw in (False, True)]
    cases += [_case(group, "fla-naive", peer, sparse, bw) for bw in (False, True)]
    return cases


def _nsa_cases(T: int) -> list[Case]:
    from lt2dsl.kernels.nsa import nsa

    def inputs():
        q, k, v = _rnd(B, T, H, D), _rnd(B, T, 1, D), _rnd(B, T, 1, D)
        gs = [torch.rand(B, T, H, device=DEV, dtype=DT).requires_grad_() for _ in range(3)]
        return q, k, v, gs

    def ours():
        q, k, v, gs = inputs()
        return (lambda: nsa(q, k, v, *gs, backend="triton", **NSA)), [q, k, v, *gs]

    def peer():
        from fla.ops.nsa import parallel_nsa

        q, k, v, gs = inputs()
        return (lambda: parallel_nsa(q, k, v, *gs, **NSA)), [q, k, v, *gs]

    return [
        _case(f"nsa HKV=1 T={T}", impl, mk, None, bw)
        for bw in (False, True)
        for impl, mk in (("lt2dsl", ours), ("fla", peer))
    ]


def _decode_cases() -> list[Case]:
    from lt2dsl.kernels.attention import attention_decode

    out = []
    for bd in (1, 8):
        for L in (4096, 8192, 32768, 131072):

            def ours(bd=bd, L=L):
                q = _rnd(bd, 1, H, D, grad=False)
                k, v = _rnd(bd, L, H, D, grad=False), _rnd(bd, L, H, D, grad=False)
                lens = torch.full((bd,), L, device=DEV, dtype=torch.int32)
                return (lambda: attention_decode(q, k, v, lens, backend="triton")), []

            def sdpa(bd=bd, L=L):
                q = _rnd(bd, H, 1, D, grad=False)
                k, v = _rnd(bd, H, L, D, grad=False), _rnd(bd, H, L, D, grad=False)
                return (lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)), []

            kv_bytes = 2 * bd * H * L * D * 2
            out += [
                Case(group=f"decode B={bd} L={L}", impl=impl, make=mk, bytes=kv_bytes)
                for impl, mk in (("lt2dsl", ours), ("sdpa", sdpa))
            ]
    return out


def cases() -> list[Case]:
    """Every case of this benchmark (filtered by the ONLY env var: comma-separated substrings)."""
    ts = [int(t) for t in os.environ.get("T", "8192,32768").split(",")]
    out = []
    for T in ts:
        out += _full_cases(T) + _swa_cases(T) + _dsa_cases(T) + _nsa_cases(T)
    out += _decode_cases()
    only = [s for s in os.environ.get("ONLY", "").split(",") if s]
    return [c for c in out if not only or any(s in c.group or s == c.impl for s in only)]


def main() -> None:
    ceilings = harness.measure_ceilings()
    tag = os.environ.get("TAG")
    rows = harness.run_cases("kernels_attn" + (f"_{tag}" if tag else ""), cases(), ceilings)
    from lt2dsl.kernels.attention import triton_bwd

    for name in ("_dkdv_tuned", "_dq_tuned", "_dkdv_ds_tuned", "_dq_ds_tuned"):
        tuned = getattr(triton_bwd, name)
        print(f"{name}: " + "; ".join(f"{k[:4]} -> {c}" for k, c in tuned.cache.items()))
    print(harness.summary_table(rows, baseline_impl="sdpa"))


if __name__ == "__main__":
    main()
