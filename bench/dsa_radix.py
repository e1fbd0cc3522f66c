"""Time DSA's indexer with the int64-key `torch.topk` selection against the staged radix selection
(`LT2_DSA_RADIX`), each rank-ordered and as a set, at B=4, T=32k, 4 index heads of 128, top-k 2048
(bf16), and check that all three select the same keys.

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
    for name, radix, ordered, reps in (("torch.topk", False, True, 3), ("torch.topk-set", False, False, 3),
                                       ("radix", True, True, 5), ("radix-set", True, False, 5)):  # fmt: skip
        triton_indexer.RADIX = radix

        def run(ordered=ordered):
            return triton_indexer.dsa_indexer_triton(qi, ki, wi, topk=K, ordered=ordered)

        outs[name] = run()
        rows[name] = _ms(run, reps)
        print(f"{name:12s} {rows[name]:9.3f} ms", flush=True)
    # the scores alone: the selection replaced by nothing (what is left is the score kernel)
    select, triton_indexer.select_topk = triton_indexer.select_topk, lambda *a: None
    rows["scores only"] = _ms(lambda: triton_indexer.dsa_indexer_triton(qi, ki, wi, topk=K, ordered=False), 5)
    triton_indexer.select_topk = select
    print(f"{'scores only':12s} {rows['scores only']:9.3f} ms", flush=True)
    same_ranked = torch.equal(outs["radix"], outs["torch.topk"])
    same_set = all(torch.equal(outs[n].sort(-1).values, outs["torch.topk"].sort(-1).values)
                   for n in ("radix-set", "torch.topk-set"))  # fmt: skip
    print(f"radix == torch.topk (rank order): {same_ranked}; same sets: {same_set}")
    with open(os.path.join(os.environ.get("OUT", "."), "dsa_radix.json"), "w") as f:
        json.dump({"shape": dict(B=B, T=T, HI=HI, DI=DI, topk=K), "ms": rows, "same_ranked": same_ranked,
                   "same_set": same_set}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
