"""`block.gdn_block_decode` (CPU interpreter here): a GDN block's decode step in one persistent
launch against the unfused chain in float64 (`gdn_block_decode_ref`), on shapes that are not
powers of two (D = 48, K = 24, V = 40 in two V tiles, MLP 40 wide), value heads grouped on fewer
q/k heads (4 on 2), the in-projection's columns in a shuffled order with padding, biased and
unbiased convs: h2, y, the state and the conv histories; the six launches and the one persistent
launch (one program here: the interpreter runs programs in turn) give the same bits."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.block import gdn_block_decode, gdn_block_decode_ref
from tests.kernels.utils import DEVICE, assert_close, rel_rms

M, D, H, HV, K, V, W, FF = 3, 48, 2, 4, 24, 40, 4, 40
SHAPE = (M, D, H, HV, K, V, FF)


def inputs(dtype, bias: bool, seed: int, shape: tuple[int, ...]):
    """(args, kwargs) of one call in float64; the offsets put z first and pad between parts."""
    M, D, H, HV, K, V, FF = shape
    g = torch.Generator().manual_seed(seed)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(DEVICE)

    sizes = {"z": HV * V, "q": H * K, "b": HV, "k": H * K, "v": HV * V, "a": HV}
    offs, at = {}, 0
    for name, n in sizes.items():
        offs[name] = at
        at += n + 3  # padding columns nobody reads
    n_in = at
    cs = (H * K, H * K, HV * V)
    args = dict(
        xn=r(M, D), res=r(M, D), w_in=r(n_in, D, scale=D**-0.5), offsets=tuple(offs[n] for n in "qkvzab"),
        conv_weights=tuple(r(c, 1, W, scale=0.5) for c in cs),
        conv_biases=tuple(r(c, scale=0.1) if bias else None for c in cs),
        hists=tuple(r(M, c, W - 1) for c in cs), A_log=r(HV, scale=0.5), dt_bias=r(HV, scale=0.5),
        state=r(M, HV, K, V, scale=0.3), gamma_o=1 + 0.2 * r(V), w_o=r(D, HV * V, scale=(HV * V) ** -0.5),
        gamma2=1 + 0.2 * r(D), w_gu=r(2 * FF, D, scale=D**-0.5), w_down=r(D, FF, scale=FF**-0.5),
    )  # fmt: skip
    kw = dict(heads=H, scale=K**-0.5, beta_scale=2.0, eps_o=1e-5, eps2=1e-6)
    return args, kw


def as_dtype(args: dict, dtype) -> dict:
    """Everything in `dtype` but the fp32 gates' parameters and state (the lowering's dtypes)."""
    out = {}
    for k, v in args.items():
        if k in ("A_log", "dt_bias", "state"):
            out[k] = v.to(torch.float64 if dtype == torch.float64 else torch.float32).clone()
        elif isinstance(v, tuple) and v and isinstance(v[0], int):
            out[k] = v
        elif isinstance(v, tuple):
            out[k] = tuple(None if t is None else t.to(dtype).clone() for t in v)
        else:
            out[k] = v.to(dtype)
    return out


def run(fn, args: dict, kw: dict, **extra):
    h2, y = fn(**args, **kw, **extra)
    return h2, y, args["state"], args["hists"]


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_block_matches_the_unfused_chain(bias):
    check(bias, SHAPE, seed=0, persistent_programs=1)


def check(bias: bool, shape, seed: int, persistent_programs: int | None) -> None:
    """bf16: as near the float64 truth as the unfused chain in bf16; the persistent launch's bits
    equal the six launches'."""
    dtype = torch.bfloat16
    args, kw = inputs(dtype, bias, seed, shape)
    rounded = as_dtype(args, dtype)
    truth = run(gdn_block_decode_ref, as_dtype(rounded, torch.float64), kw)
    chain = run(gdn_block_decode_ref, as_dtype(rounded, dtype), kw)
    split = run(gdn_block_decode, as_dtype(rounded, dtype), kw, persistent=False)
    one = run(gdn_block_decode, as_dtype(rounded, dtype), kw, persistent=True, programs=persistent_programs)
    for name, got, want, ref in zip(("h2", "y", "state"), split, truth, chain):
        assert got.dtype == ref.dtype and got.shape == ref.shape, name
        assert torch.isfinite(got).all(), name
        assert_close(name, got.double(), want.double(), 1.5 * rel_rms(ref.double(), want.double()) + 2e-6)
    for name, h, th in zip("qkv", split[3], truth[3]):
        assert torch.equal(h.double(), th.to(h.dtype).double()), f"{name} history"
    for name, a, b in zip(("h2", "y", "state"), split, one):
        assert torch.equal(a, b), f"{name}: the persistent launch differs from the six launches"
    for a, b in zip(split[3], one[3]):
        assert torch.equal(a, b), "history: the persistent launch differs from the six launches"


def test_bad_inputs_are_named():
    args, kw = inputs(torch.bfloat16, False, 0, SHAPE)
    args = as_dtype(args, torch.bfloat16)
    with pytest.raises(ValueError, match="w_o must be"):
        gdn_block_decode(**{**args, "w_o": args["w_o"][:, :-1]}, **kw)
    with pytest.raises(ValueError, match="offsets"):
        gdn_block_decode(**{**args, "offsets": (0, 0, 0, 0, 0, 10_000)}, **kw)
    with pytest.raises(ValueError, match="1 ≤ M ≤ 16"):
        gdn_block_decode(**{**args, "xn": args["xn"].float()}, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8])
def test_gpu_hybrid_block_one_launch(M):
    """The hybrid example's GDN block (D 2048, 16 heads of K 128, V 256, MLP 5632) on the card, one
    launch of #SMs programs through its grid barriers, over four seeds: as near the float64 truth
    as the unfused chain and the same bits as the six launches."""
    for seed in range(4):
        check(seed % 2 == 1, (M, 2048, 16, 16, 128, 256, 5632), seed, persistent_programs=None)
