"""Time DSA's indexer: rank order (int64 keys, `torch.topk`) and the set (the radix selection), at
B=4, T=32k, 4 index heads of 128, top-k 2048 (bf16), and the scores alone; check that both select
the same keys.

    python3 bench/dsa_radix.py        # writes dsa_radix.json to $OUT (default ".")
"""

from __future__ import annotations

import json
import os

import torch

from lt2dsl.kernels.dsa import triton_indexer


def _ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    B, T, HI, DI, K = 4, int(os.environ.get("T", "32768")), 4, 128, 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    qi = torch.randn(B, T, HI, DI, device="cuda", generator=g).bfloat16()
    ki = torch.randn(B, T, DI, device="cuda", generator=g).bfloat16()
    wi = torch.randn(B, T, HI, device="cuda", generator=g).bfloat16()
    rows = {}
    outs = {}
    for name, ordered, reps in (("ranked (torch.topk)", True, 3), ("set (radix)", False, 5)):

        def run(ordered=ordered):
            return triton_indexer.dsa_indexer_triton(qi, ki, wi, topk=K, ordered=ordered)

        outs[name] = run()
        rows[name] = _ms(run, reps)
        print(f"{name:20s} {rows[name]:9.3f} ms", flush=True)
    # the scores alone: the selection replaced by nothing (what is left is the score kernel)
    select, triton_indexer.select_topk = triton_indexer.select_topk, lambda *a: None
    rows["scores only"] = _ms(lambda: triton_indexer.dsa_indexer_triton(qi, ki, wi, topk=K, ordered=False), 5)
    triton_indexer.select_topk = select
    print(f"{'scores only':20s} {rows['scores only']:9.3f} ms", flush=True)
    same_set = torch.equal(outs["set (radix)"].sort(-1).values, outs["ranked (torch.topk)"].sort(-1).values)
    print(f"same sets: {same_set}")
    with open(os.path.join(os.environ.get("OUT", "."), "dsa_radix.json"), "w") as f:
        json.dump(
            {"shape": dict(B=B, T=T, HI=HI, DI=DI, topk=K), "ms": rows, "same_set": same_set}, f, indent=1
        )


if __name__ == "__main__":
    main()
