"""Kernel warnings (W04xx): power-of-two head dims, and the `LayerSpec.kernel_note` mechanism."""

import dataclasses

import pytest

from lt2dsl.ir import registry
from lt2dsl.validate.kernels import is_pow2
from tests.validate.helpers import at, codes, one


def test_is_pow2():
    assert [x for x in range(70) if is_pow2(x)] == [1, 2, 4, 8, 16, 32, 64]


def test_power_of_two_head_dims_are_quiet():
    assert codes("dim = 1024\nheads = 8\nfull; gdn; gla; mlstm; mamba2; tmm(max_len=1k); linear") == []


def test_a_derived_model_head_dim_points_at_heads_once():
    d = one("dim = 768\nheads = 8\nloop T=2 < full; swa; deltanet >", "W0401")
    assert at(d) == (2, 9, 10)  # head_dim = dim / heads = 96
    assert "`full`" in d.notes[0] and "`swa`" in d.notes[0] and "`deltanet`" in d.notes[0]


def test_value_and_key_dims_from_factors():
    d = one("dim = 1024\ngla(expand_k=3/4)", "W0401")  # key head dim 128 · 3/4 = 96
    assert at(d) == (2, 14, 17) and d.message == "head dim 96 is not a power of two"
    assert codes("dim = 1024\nretnet(expand_v=2)") == []


def test_mamba2_head_dim_is_its_own():
    # mamba2's head dim defaults to 64 whatever the model's head_dim is
    assert codes("dim = 1536\nheads = 16\nhead_dim = 96\nmamba2", ) == []
    assert at(one("dim = 1536\nmamba2(head_dim=48)", "W0401")) == (2, 17, 19)


def test_no_kernel_warnings_while_shapes_are_wrong():
    assert codes("dim = 1000\nheads = 16\ngdn") == ["E0508"]


def test_kernel_note_mechanism(monkeypatch):
    """A spec's `kernel_note(opts, cfg)` becomes a W0402 warning at the call."""

    def note(opts, cfg):
        if opts["heads"] // opts["kv_heads"] < 16:
            return "a query/key-value head ratio below 16 runs on the reference path"
        return None

    spec = dataclasses.replace(registry.REGISTRY["nsa"], kernel_note=note)
    monkeypatch.setitem(registry.REGISTRY, "nsa", spec)
    d = one("dim = 1024\nheads = 16\nnsa(kv_heads=4)", "W0402")
    assert d.message == "`nsa`: a query/key-value head ratio below 16 runs on the reference path"
    assert at(d) == (3, 1, 4) and d.severity == "warning"
    assert codes("dim = 1024\nheads = 16\nnsa(kv_heads=1)") == []


@pytest.mark.parametrize("kind", list(registry.REGISTRY))
def test_kernel_notes_of_the_registered_specs_run(kind):
    """Whatever notes the specs define are called with resolved options without failing."""
    text = "dim = 1024\nmax_len = 4k\n" + kind
    assert "E9999" not in codes(text)
