"""Winding numbers against symbols whose index is known analytically, and against root counts."""

from __future__ import annotations

import numpy as np
import pytest

from lt2dsl.analysis.winding import layer_index, layer_windings, winding_number


def coefficients(roots, scale: complex = 1.0) -> np.ndarray:
    """w with a(z) = scale · Π (z − r): w[m] is the coefficient of z^m."""
    return scale * np.poly(roots)[::-1]


@pytest.mark.parametrize(
    "w, wind",
    [
        ([1.0], 0),  # the identity
        ([0, 0, 0, 1.0], 3),  # z^3: a three-step delay, index −3
        ([-0.5, 1.0], 1),  # z − 0.5
        ([-2.0, 1.0], 0),  # z − 2: the zero is outside
        ([1.0, 0.9], 0),  # 1 + 0.9 z, zero at −1.11
        (coefficients([0.5, 0.25j, 3, -0.9]), 3),
        (coefficients([0.999, -0.999j, 1.001]), 2),  # zeros within 1e-3 of the circle
        (coefficients([2j, -1.5, 0.1 + 0.1j], scale=-3j), 1),
    ],
)
def test_known_windings(w, wind):
    got = winding_number(np.asarray(w))
    assert got.number == wind and got.certified and got.margin > 0


def test_a_symbol_vanishing_on_the_circle_has_no_index():
    for w in ([-1.0, 1.0], coefficients([1j, 0.3])):
        got = winding_number(np.asarray(w))
        assert got.number is None and not got.certified and got.margin < 1e-9


def test_random_kernels_count_their_zeros_in_the_disc():
    rng = np.random.default_rng(0)
    for n in (8, 40, 96):
        for _ in range(3):
            w = rng.normal(size=n) * np.sqrt(2 / n)  # the layer's Kaiming init
            inside = int((np.abs(np.roots(w[::-1])) < 1).sum())
            got = winding_number(w)
            assert got.certified and got.number == inside


def test_too_few_samples_is_not_certified():
    w = coefficients([0.999, -0.999j, 1.001])
    got = winding_number(w, max_points=4096)
    assert not got.certified and got.points == 4096


def test_layer_index_uses_the_diagonal_tap():
    # kernel 2, heads 2, n 5: tap 1 is channel c's own input, tap 0 the channel below it
    w = np.zeros((2, 2, 5))
    w[1, 0] = np.pad(coefficients([0.5, -0.2]), (0, 2))  # 2 zeros inside
    w[1, 1] = np.pad(coefficients([-3.0]), (0, 3))  # none inside
    w[0, 0] = np.pad(coefficients([0.1, 0.2, 0.3, 0.4]), (0, 0))  # off the diagonal: no effect
    w[0, 1] = [1.0, 0, 0, 0, 0]
    rows = layer_windings(w, block=7)
    assert [(r.tap, r.head, r.winding, r.diagonal) for r in rows] == [
        (0, 0, 4, False),
        (0, 1, 0, False),
        (1, 0, 2, True),
        (1, 1, 0, True),
    ]
    assert layer_index(rows, channels=8, heads=2) == -(8 // 2) * (2 + 0)
    assert layer_windings(w, block=0, length=2)[2].winding == 1  # the first two coefficients only
    w[1, 1] = [1.0, -1.0, 0, 0, 0]  # vanishes at z = 1
    assert layer_index(layer_windings(w, block=0), channels=8, heads=2) is None


def test_bad_symbols_are_refused():
    with pytest.raises(ValueError, match="1-D"):
        winding_number(np.zeros((2, 3)))
