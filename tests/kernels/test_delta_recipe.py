"""`default_recipe`: which kernel forms a delta-rule call runs, as a pure function of its inputs."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from lt2dsl.kernels.delta.recipe import (
    RECIPES,
    DeltaRecipe,
    DeltaShape,
    default_recipe,
    every_recipe,
    named_recipe,
    resolve_recipe,
)

H200 = SimpleNamespace(multi_processor_count=132)
BF16 = torch.bfloat16


def shape(gate: str, N: int = 4, HV: int = 16, V: int = 128) -> DeltaShape:
    return DeltaShape(gate, N, HV, 128, V)


@pytest.mark.parametrize(
    "N, HV, V, fused",
    [(4, 16, 128, True), (1, 16, 128, False), (1, 33, 128, True), (1, 32, 128, False), (2, 16, 64, False)],
    ids=["B4-128-programs", "B1-32-programs", "66-programs", "64-programs", "V64-32-programs"],
)
def test_the_gated_fused_scan_needs_half_the_sms(N, HV, V, fused):
    """GDN's fused scan runs one program per (64-wide value tile, sequence x head): with fewer
    than half the SMs' worth the split form is the default; DeltaNet keeps the fused scan, KDA
    never has it."""
    assert default_recipe(shape("scalar", N, HV, V), BF16, H200).fused_scan is fused
    assert default_recipe(shape("none", N, HV, V), BF16, H200).fused_scan
    assert not default_recipe(shape("channel", N, HV, V), BF16, H200).fused_scan


def test_without_a_device_the_scalar_gate_scans_fused():
    """The CPU interpreter has no SMs to fill: GDN and DeltaNet take the fused scan."""
    assert default_recipe(shape("scalar", 1), BF16, None).fused_scan
    assert default_recipe(shape("scalar", 1), BF16, SimpleNamespace()).fused_scan


@pytest.mark.parametrize(
    "gate, dtype, bk",
    [
        ("none", BF16, 64),
        ("scalar", torch.float16, 64),
        ("scalar", torch.float32, 32),
        ("none", torch.float32, 32),
        ("channel", BF16, 32),
    ],
)
def test_the_gradient_key_tile_follows_dtype_and_gate(gate, dtype, bk):
    assert default_recipe(shape(gate), dtype, H200).grad_bk == bk


def test_the_default_is_pure_and_frozen():
    a = default_recipe(shape("scalar", 1), BF16, H200)
    assert a == default_recipe(shape("scalar", 1), BF16, H200)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.fused_scan = True  # type: ignore[misc]
    with pytest.raises(ValueError, match="gate must be one of"):
        default_recipe(shape("vector"), BF16, H200)


def test_named_recipes_set_fields_of_the_default():
    assert set(RECIPES) == {"default", "fused", "split"}
    s = shape("scalar", 4)
    assert named_recipe("split", s, BF16, H200) == DeltaRecipe(fused_scan=False, grad_bk=64)
    assert named_recipe("fused", shape("scalar", 1), torch.float32, H200) == DeltaRecipe(True, 32)
    assert named_recipe("default", s, BF16, H200) == default_recipe(s, BF16, H200)
    with pytest.raises(ValueError, match="unknown delta recipe 'x'; known: default, fused, split"):
        named_recipe("x", s, BF16, H200)


def test_every_recipe_is_every_form_the_kernels_have():
    assert len(every_recipe("none")) == len(every_recipe("scalar")) == 4
    assert every_recipe("channel") == [DeltaRecipe(fused_scan=False, grad_bk=32)]


def test_resolve_checks_the_recipe_against_the_rule():
    cpu = torch.device("cpu")
    assert resolve_recipe(None, shape("channel"), BF16, cpu) == DeltaRecipe(False, 32)
    assert resolve_recipe("split", shape("none"), BF16, cpu) == DeltaRecipe(False, 64)
    r = DeltaRecipe(fused_scan=True, grad_bk=32)
    assert resolve_recipe(r, shape("scalar"), BF16, cpu) is r
    with pytest.raises(ValueError, match="no fused scan"):
        resolve_recipe(r, shape("channel"), BF16, cpu)
    with pytest.raises(TypeError, match="got int"):
        resolve_recipe(3, shape("none"), BF16, cpu)
