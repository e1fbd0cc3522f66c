"""Per-tile timings of the gated attention backward's dS path, and the forward's gate-load placement.

Gated full causal attention, B=4, T=8192, H=16, D=128, bf16 (issue 6's shape), fwd+bwd:
- the autotuned default (the tuner's picks over the lists, printed), and without a gate;
- the dK/dV-with-dS kernel forced to each config of `KV_DS_CONFIGS` (dQ-from-dS tuned), then the
  dQ-from-dS kernel forced to each of `DS_CONFIGS` (dK/dV tuned): which tile the tuner should have;
- the gate loaded before the diagonal blocks (`LT2_ATTN_GATE_EARLY=1`, the default) against in the
  epilogue (`=0`);
- one dS buffer for all heads (`LT2_ATTN_DS_BYTES` 16 GiB) against head groups under 4 GiB;
- torch SDPA (default backend) and the peer's `parallel_attn` in the same process.

Usage (GPU): `PYTHONPATH=. OUT=$OUT python bench/attn_tiles.py` → `$OUT/attn_tiles.json` (the
seventeenth session ran it with `LT2_ATTN_CANDIDATES=1`, the switch that then added the candidate
tiles now in the lists).
"""

from __future__ import annotations

import os

import torch

from bench import harness
from bench.harness import Case
from bench.kernels_attn import _causal_flops, _rnd

B, T, H, D = 4, int(os.environ.get("T", 8192)), 16, 128


def _cfg_name(c) -> str:
    kw = ",".join(f"{k}{v}" for k, v in c.kwargs.items())
    return f"{kw},w{c.num_warps},s{c.num_stages}"


def main() -> None:
    from lt2dsl.kernels.attention import attention
    from lt2dsl.kernels.attention import triton_bwd as TB

    def ours(gate=True, env=None, force=None):
        """`force`: (tuned kernel, config) run alone, set when the case is made (before timing)."""

        def make():
            for tuned in (TB._dkdv_ds_tuned, TB._dq_ds_tuned):
                tuned.configs, tuned.cache = saved[tuned], {}
            if force is not None:
                tuned, c = force
                tuned.configs, tuned.cache = [c], {}
            for k in ("LT2_ATTN_GATE_EARLY", "LT2_ATTN_DS_BYTES"):
                os.environ.pop(k, None)
            os.environ.update(env or {})
            q, k, v = _rnd(B, T, H, D), _rnd(B, T, H, D), _rnd(B, T, H, D)
            g = _rnd(B, T, H, D) if gate else None
            return (lambda: attention(q, k, v, gate=g, backend="triton")), [q, k, v] + ([g] if gate else [])

        return make

    def sdpa_default():
        q, k, v = _rnd(B, H, T, D), _rnd(B, H, T, D), _rnd(B, H, T, D)
        return (lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)), [q, k, v]

    def peer():
        from fla.ops.attn import parallel_attn

        q, k, v = _rnd(B, T, H, D), _rnd(B, T, H, D), _rnd(B, T, H, D)
        return (lambda: parallel_attn(q, k, v)), [q, k, v]

    saved = {t: list(t.configs) for t in (TB._dkdv_ds_tuned, TB._dq_ds_tuned)}
    group, fl = f"attn full T={T}", _causal_flops(T)

    def case(impl, make, bw=True):
        return Case(group=group, impl=impl, make=make, backward=bw, flops=fl * (3.5 if bw else 1.0))

    early, late = {"LT2_ATTN_GATE_EARLY": "1"}, {"LT2_ATTN_GATE_EARLY": "0"}
    cases = [
        case("sdpa-default", sdpa_default, False),
        case("lt2dsl+gate", ours(), False),
        case("lt2dsl+gate late", ours(env=late), False),
        case("lt2dsl+gate early", ours(env=early), False),
        case("lt2dsl", ours(gate=False), False),
        case("sdpa-default", sdpa_default),
        case("fla", peer),
        case("lt2dsl+gate", ours()),
        case("lt2dsl+gate late", ours(env=late)),
        case("lt2dsl+gate early", ours(env=early)),
        case("lt2dsl", ours(gate=False)),
        case("lt2dsl+gate one dS", ours(env={"LT2_ATTN_DS_BYTES": str(16 << 30)})),
    ]
    rows = harness.run_cases("attn_tiles_tuned", cases)
    picks = {
        name: (None if t.best_config is None else _cfg_name(t.best_config))
        for name, t in (("dkdv_ds", TB._dkdv_ds_tuned), ("dq_ds", TB._dq_ds_tuned))
        if hasattr(t, "best_config")
    }
    print("tuner picks:", picks, flush=True)
    forced = [
        case(f"{name} {_cfg_name(c)}", ours(force=(tuned, c)))
        for name, tuned in (("dkdv_ds", TB._dkdv_ds_tuned), ("dq_ds", TB._dq_ds_tuned))
        for c in saved[tuned]
    ]
    rows += harness.run_cases("attn_tiles_forced", forced)
    out = os.environ.get("OUT", ".")
    import json

    with open(os.path.join(out, "attn_tiles.json"), "w") as f:
        json.dump({"rows": rows, "picks": picks, "versions": harness.versions()}, f, indent=1)
    print(harness.summary_table(rows, baseline_impl="sdpa-default"))


if __name__ == "__main__":
    main()
