"""Time the mLSTM backward's stabiliser kernel (`route_and_finish`) per tokens-per-step block and
warp count at the benchmark shape (B=4, T=8192, H=16, NK=2), each checked equal to the default.

    python3 bench/mlstm_route.py      # writes mlstm_route.json to $OUT (default ".")
"""

from __future__ import annotations

import functools
import json
import os

import torch
from triton.testing import do_bench

from lt2dsl.kernels.mlstm.stabiliser_triton import route_and_finish


def main() -> None:
    B, T, H, NK = 4, 8192, 16, 2
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s, scale=1.0):
        return torch.randn(*s, device="cuda", generator=g) * scale

    f, ig, dm = rnd(B, T, H) + 2, rnd(B, T, H, scale=3), rnd(B, T, H)
    dlf_k, di_k = rnd(NK, B, T, H), rnd(NK, B, T, H)
    args = (f, ig, dm, None, None, dlf_k, di_k, None)
    ref = route_and_finish(*args)
    rows = []
    for block in (512, 1024, 2048, 4096):
        for warps in (4, 8, 16):
            out = route_and_finish(*args, block=block, num_warps=warps)
            err = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in zip(out, ref))
            run = functools.partial(route_and_finish, *args, block=block, num_warps=warps)
            us = 1e3 * do_bench(run, return_mode="median")
            rows.append({"block": block, "num_warps": warps, "us": us, "max_rel_diff": err})
            print(f"block {block:5d} warps {warps:2d}: {us:7.1f} us  (max rel diff {err:.1e})", flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "mlstm_route.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
