"""`block.gdn_block_decode` (CPU interpreter here): a GDN block's decode step in one persistent
launch against the unfused chain in float64 (`gdn_block_decode_ref`), on shapes that are not
powers of two (D = 48, K = 24, V = 40 in two V tiles, MLP 40 wide), value heads grouped on fewer
q/k heads (4 on 2), the in-projection's columns in a shuffled order with padding, biased and
unbiased convs: h2, y, the state and the conv histories; the six launches and the one persistent
launch (one program here: the interpreter runs programs in turn) give the same bits."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.block import CONFIGS, gdn_block_decode, gdn_block_decode_ref
from lt2dsl.kernels.block.testing import as_dtype, inputs
from tests.kernels.utils import DEVICE, assert_close, rel_rms

M, D, H, HV, K, V, W, FF = 3, 48, 2, 4, 24, 40, 4, 40
SHAPE = (M, D, H, HV, K, V, FF)


def run(fn, args: dict, kw: dict, **extra):
    h2, y = fn(**args, **kw, **extra)
    return h2, y, args["state"], args["hists"]


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_block_matches_the_unfused_chain(bias):
    check(bias, SHAPE, seed=0, persistent_programs=1)


@pytest.mark.parametrize("config", CONFIGS[1:], ids=[f"config{i}" for i in range(1, len(CONFIGS))])
def test_every_config_matches_the_unfused_chain(config):
    """The other tiles (the default is the test above's): the products' K tiles change the sums'
    order, not how near the truth they are."""
    check(True, SHAPE, seed=4, persistent_programs=1, config=config)


def check(bias: bool, shape, seed: int, persistent_programs: int | None, config=None) -> None:
    """bf16: as near the float64 truth as the unfused chain in bf16 (the conv histories: the
    projection's outputs rounded, so within the chain's own error of it); the persistent launch's
    bits equal the six launches'."""
    dtype = torch.bfloat16
    args, kw = inputs(bias, seed, shape, DEVICE)
    rounded = as_dtype(args, dtype)
    truth = run(gdn_block_decode_ref, as_dtype(rounded, torch.float64), kw)
    chain = run(gdn_block_decode_ref, as_dtype(rounded, dtype), kw)
    split = run(gdn_block_decode, as_dtype(rounded, dtype), kw, persistent=False, config=config)
    one = run(gdn_block_decode, as_dtype(rounded, dtype), kw, persistent=True, programs=persistent_programs,
              config=config)  # fmt: skip
    names = ("h2", "y", "state", "q history", "k history", "v history")
    for name, got, want, ref in zip(names, (*split[:3], *split[3]), (*truth[:3], *truth[3]),
                                    (*chain[:3], *chain[3])):  # fmt: skip
        assert got.dtype == ref.dtype and got.shape == ref.shape, name
        assert torch.isfinite(got).all(), name
        assert_close(name, got.double(), want.double(), 1.5 * rel_rms(ref.double(), want.double()) + 2e-6)
    for name, a, b in zip(("h2", "y", "state"), split, one):
        assert torch.equal(a, b), f"{name}: the persistent launch differs from the six launches"
    for a, b in zip(split[3], one[3]):
        assert torch.equal(a, b), "history: the persistent launch differs from the six launches"


def test_programs_share_each_phase_by_stride():
    """Each phase split over 3 and over 5 programs (items p, p + P, …: the persistent launch's
    division, which its one-program CPU run leaves untested) gives the one-program-an-item bits."""
    args, kw = inputs(True, 1, SHAPE, DEVICE)
    want = run(gdn_block_decode, as_dtype(args, torch.bfloat16), kw, persistent=False)
    for P in (3, 5):
        got = run(gdn_block_decode, as_dtype(args, torch.bfloat16), kw, persistent=False, programs=P)
        for a, b in zip((*got[:3], *got[3]), (*want[:3], *want[3])):
            assert torch.equal(a, b), P


def test_bad_inputs_are_named():
    args, kw = inputs(False, 0, SHAPE, DEVICE)
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


def test_each_grid_size_has_its_own_barrier_counter():
    """A persistent launch's barrier base is its counter rounded down to 5 · P: launches of two
    grid sizes sharing one counter would pass barriers early, so each size gets its own, and one
    launch adds 5 · P to it."""
    from lt2dsl.kernels.block import barrier_counter

    args, kw = inputs(False, 2, SHAPE, DEVICE)
    for P in (1, 1, 2):
        before = {p: barrier_counter(torch.device(DEVICE), p).item() for p in (1, 2)}
        if P == 2 and DEVICE == "cpu":
            break  # two programs would wait for each other forever under the interpreter
        gdn_block_decode(**as_dtype(args, torch.bfloat16), **kw, persistent=True, programs=P)
        after = {p: barrier_counter(torch.device(DEVICE), p).item() for p in (1, 2)}
        assert after[P] - before[P] == 5 * P and after[3 - P] == before[3 - P]


@pytest.mark.parametrize("programs", [None, 1, 3], ids=["an-item-each", "one", "three"])
def test_flat_loop_gives_the_nested_loops_bits(programs):
    """Each flat config (one loop over a program's tiles and K tiles) against the nested loops at
    the same K tile: the same sums in the same order, so the same bits, with one program an item
    and with one or three programs sharing each phase."""
    args, kw = inputs(False, 3, SHAPE, DEVICE)
    flats = [c for c in CONFIGS if c.flat]
    assert flats
    for cfg in flats:
        nested = cfg._replace(flat=False)
        assert nested in CONFIGS, cfg
        want = run(gdn_block_decode, as_dtype(args, torch.bfloat16), kw, persistent=False, programs=programs,
                   config=nested)  # fmt: skip
        got = run(gdn_block_decode, as_dtype(args, torch.bfloat16), kw, persistent=False, programs=programs,
                  config=cfg)  # fmt: skip
        for a, b in zip((*got[:3], *got[3]), (*want[:3], *want[3])):
            assert torch.equal(a, b), cfg
