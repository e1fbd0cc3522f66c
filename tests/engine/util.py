"""Shared helpers of the engine tests: the eager reference paths, the float64 truth, a no-host-sync check."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lt2dsl.engine import Engine, StaticCache
from lt2dsl.engine.step import decode_one, prefill
from lt2dsl.lowering import compile_model

# aten ops that read a device value back to the host or whose output shape depends on data: a
# captured step can contain none of them
HOST_SYNC = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "item"}


class NoHostSync(TorchDispatchMode):
    """Raise AssertionError on any op of `HOST_SYNC` run inside the block."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in HOST_SYNC:
            raise AssertionError(f"host sync in a decode step: {func}")
        return func(*args, **(kwargs or {}))


def jitter(model, scale: float = 0.05, seed: int = 0):
    """Add noise to every parameter, so parameters initialised to zero (biases, tmm's position
    bias, NSA's block embedding) take part in what a test compares."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device))
    return model


def eager_greedy(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """The eager path: one prefill then `model(tok, cache)` per token through a dynamic cache."""
    cache = model.new_cache(ids.shape[0])
    out = [ids]
    with torch.no_grad():
        logits = model(ids, cache)
        for i in range(n):
            out.append(logits[:, -1].argmax(-1, keepdim=True))
            if i + 1 < n:
                logits = model(out[-1], cache)
    return torch.cat(out, dim=1)


def dynamic_logits(model, seq: torch.Tensor, T: int) -> torch.Tensor:
    """Teacher-forced along `seq [B, N]` through a dynamic cache: a prefill of its first T tokens,
    then one token per call; the logits that predict tokens T..N−1, `[B, N − T, vocab]`."""
    cache = model.new_cache(seq.shape[0])
    with torch.no_grad():
        out = [model(seq[:, :T], cache)[:, -1]]
        out += [model(seq[:, i : i + 1], cache)[:, -1] for i in range(T, seq.shape[1] - 1)]
    return torch.stack(out, dim=1)


def static_logits(model, seq: torch.Tensor, T: int, chunk: int = 2048) -> torch.Tensor:
    """`dynamic_logits` through the engine's code: a `StaticCache`, a chunked prefill of the rows,
    then `decode_one` per token."""
    B = seq.shape[0]
    cache = StaticCache.allocate(model, B, seq.shape[1])
    with torch.no_grad():
        out = [prefill(model, seq[:, :T], cache.rows(0, B), chunk)]
        out += [decode_one(model, seq[:, i : i + 1], cache) for i in range(T, seq.shape[1] - 1)]
    return torch.stack(out, dim=1)


class Unresolvable(AssertionError):
    """The model's own forward in its dtype is too far from the float64 truth for a comparison of
    the cache paths against that truth to tell a wrong step from rounding."""


# A cache path may be at most RATIO times as far from the float64 truth as the model's own forward
# in the same dtype and kernels, plus FLOOR: on the CPU both paths measured within 2% of the bf16
# forward's distance (Triton interpreter, both delta-rule recipes, 70-token prompts, 20-30 steps)
# and within 10% of a float32 forward's (1.2e-5 against 1.3e-5), where the decode kernels' sums
# differ from the chunked ones by more than the forward's tiny distance: FLOOR covers that.
RATIO, FLOOR = 1.25, 0.01
# The comparison is made only where the forward is within RESOLVABLE of the truth, so that a wrong
# step stays outside the largest bound, RATIO · RESOLVABLE + FLOOR: a decode step stuck at one
# position moved a tiny hybrid's logits by 0.16 (`test_the_gpu_comparisons_on_the_cpu`). Elsewhere
# the model's dtype cannot tell a wrong step from rounding: random-init sandwich-norm GDN stacks
# amplify bf16 rounding until a forward is uncorrelated with the truth (distance ~1.41 at 96
# layers, dim 256 on the CPU; 0.036 in float32); the other examples' bf16 forwards measured
# 0.013-0.17 there, their float32 ones below 1e-4.
RESOLVABLE = 0.1


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (Frobenius, in float64)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def forward_logits(model, seq: torch.Tensor, T: int) -> torch.Tensor:
    """One forward over `seq [B, N]` without a cache: the logits predicting tokens T..N−1,
    `[B, N − T, vocab]`."""
    with torch.no_grad():
        return model(seq)[:, T - 1 : -1]


def truth_logits(model, seq: torch.Tensor, T: int) -> torch.Tensor:
    """`forward_logits` of a float64 copy of `model` (same weights, reference kernels, unfused)."""
    ref = compile_model(model.ir, backend="reference", dtype=torch.float64, device=model.embed.weight.device,
                        fuse=False)  # fmt: skip
    ref.load_state_dict(model.state_dict())
    return forward_logits(ref.eval(), seq, T).double()


def assert_near_the_truth(model, seq: torch.Tensor, T: int, truth: torch.Tensor | None = None) -> dict:
    """The static and dynamic caches' logits along `seq` (a prompt of T tokens, then one token per
    step) are at most `RATIO` times (+ `FLOOR`) as far from the float64 truth (`truth_logits`, given
    or made here) as one forward of the model over `seq`; the relative distances by path.

    Raises `Unresolvable` when that forward itself is farther than `RESOLVABLE` from the truth."""
    truth = truth_logits(model, seq, T) if truth is None else truth
    errs = {"forward": relative(forward_logits(model, seq, T), truth)}
    if errs["forward"] > RESOLVABLE:
        raise Unresolvable(
            f"the {model.embed.weight.dtype} forward is {errs['forward']:.3g} from the float64 truth "
            f"(over {RESOLVABLE}): the comparison cannot resolve a wrong step from rounding"
        )
    errs["static"] = relative(static_logits(model, seq, T), truth)
    errs["dynamic"] = relative(dynamic_logits(model, seq, T), truth)
    bound = RATIO * errs["forward"] + FLOOR
    far = ", ".join(f"{k} {v:.3g}" for k, v in errs.items())
    ok = errs["static"] <= bound and errs["dynamic"] <= bound
    assert ok, f"cache logits from the truth: {far} (bound {bound:.3g})"
    return errs


def assert_near_the_truth_resolved(model, seq: torch.Tensor, T: int) -> dict:
    """`assert_near_the_truth` in the model's dtype or, where that cannot resolve (`Unresolvable`),
    on the model converted to float32 (in place, exact: same weights); the distances and the dtype."""
    truth = truth_logits(model, seq, T)
    try:
        return assert_near_the_truth(model, seq, T, truth) | {"dtype": str(model.embed.weight.dtype)}
    except Unresolvable:
        return assert_near_the_truth(model.float(), seq, T, truth) | {"dtype": "torch.float32"}


def greedy_pairs(model, calls, **kw) -> tuple[Engine, list[tuple]]:
    """Each greedy call `(prompts, n)` through the model's engine (captured on CUDA) and through
    `Engine(model, capture=False)` (the same static-cache code run eagerly), both making the same
    calls in the same order: the first engine and (its tokens, the eager engine's) per call."""
    captured, eager = Engine(model, **kw), Engine(model, capture=False, **kw)
    return captured, [(captured.generate(p, n), eager.generate(p, n)) for p, n in calls]


def same(a, b) -> bool:
    """Bitwise equal tokens: tensors, or lists of 1-D tensors."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
