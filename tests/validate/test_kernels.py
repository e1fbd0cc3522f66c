"""Kernel warnings (W04xx): the delta-rule head-dim limit, and the `LayerSpec.kernel_note` mechanism."""

import dataclasses

import pytest

from lt2dsl.ir import registry
from tests.validate.helpers import at, codes, one


def test_delta_head_dims_up_to_256_are_quiet():
    assert codes("dim = 2048\nheads = 8\ngdn; kda; deltanet; full; gla; mlstm; mamba2") == []
    assert codes("dim = 1024\nhead_dim = 96\ngdn; full") == []  # any width up to 256 runs Triton


@pytest.mark.parametrize("kind", ["gdn", "kda", "deltanet"])
def test_delta_head_dim_above_256_warns_at_the_option(kind):
    d = one(f"dim = 2048\n{kind}(heads=4, head_dim=512)", "W0401")
    assert d.message == f"`{kind}` key head dim 512 is above 256"
    assert at(d)[0] == 2 and d.severity == "warning"


def test_inherited_head_dim_points_at_the_model_setting():
    d = one("dim = 2048\nheads = 4\nloop T=2 < gdn; full >", "W0401")  # head_dim = 2048 / 4
    assert at(d)[0] == 2
    assert codes("dim = 2048\nheads = 4\nfull") == []  # attention is not limited


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
