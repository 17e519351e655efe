"""Theorem 2 on the distance's own step: the closed form with a resolution r, the
multi-field step, the infeasible-τ message and the one-line protection summary."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import erf

from vflink.errors import LinkageError
from vflink.linkage import (
    DEFAULT_FALLBACK_SIGMA,
    DEFAULT_TAU,
    describe_protection,
    sigma_for_tau,
    tau_for_sigma,
    tau_min,
)
from vflink.linkage.fields import (
    FieldSpec,
    FieldValues,
    brute_fields,
    field_resolution,
    search_fields,
)
from vflink.linkage.search import Neighbours
from vflink.linkage.soft import soft_linkage


@pytest.mark.parametrize(("sigma", "sigma0", "r"), [(0.1, 0.05, 0.002), (1.0, 40.0, 1.0),
                                                     (0.3, 0.12, 0.0012), (4.0, 3.0, 0.5)])
def test_tau_with_a_resolution_is_the_closed_form(sigma: float, sigma0: float, r: float) -> None:
    expected = float(erf(r * math.sqrt(sigma**2 + 1) / (2 * math.sqrt(2) * sigma * sigma0)))
    assert tau_for_sigma(sigma, sigma0, resolution=r) == pytest.approx(expected, rel=1e-12)
    # the same as Theorem 2 with σ0 counted in steps
    assert tau_for_sigma(sigma, sigma0, resolution=r) == pytest.approx(
        tau_for_sigma(sigma, sigma0 / r), rel=1e-12)
    assert tau_min(sigma0, resolution=r) == pytest.approx(
        float(erf(r / (2 * math.sqrt(2) * sigma0))), rel=1e-12)


def test_sigma_for_tau_inverts_on_any_scale() -> None:
    sigma0, r = 0.0567, 0.0015  # a multi-field distance in [0, 1]
    for tau in (0.999, 0.5, 0.05):
        sigma = sigma_for_tau(tau, sigma0, resolution=r)
        assert tau_for_sigma(sigma, sigma0, resolution=r) == pytest.approx(tau, rel=1e-9)
    # on the Hamming scale (r = 1) the same σ0 has τ_min = 1 and no τ < 1 is reachable
    with pytest.raises(LinkageError):
        sigma_for_tau(0.999, sigma0)


def test_an_unreachable_tau_names_the_smallest_feasible_one_and_sigma() -> None:
    sigma0 = 5.0
    floor = tau_min(sigma0)
    with pytest.raises(LinkageError) as info:
        sigma_for_tau(floor / 2, sigma0)
    text = str(info.value)
    assert f"{floor:.6g}" in text and "sigma" in text
    suggested = float(text.split("choose tau ≥ ")[1].split(" ")[0])
    assert floor < suggested < 1.0
    assert sigma_for_tau(suggested, sigma0) > 0  # the suggestion is feasible


def test_describe_protection() -> None:
    text = describe_protection(0.2, 0.05, 3.0e9, 1e-5)
    assert text == ("similarities: Gaussian noise σ = 0.2, greedy-attack bound τ = 0.05 "
                    "(FedSim Theorem 2), ε = 3e+09 at δ = 1e-05 (Theorem 1)")
    assert describe_protection(0.0, 1.0, math.inf, 1e-5).startswith(
        "similarities: none (τ = 1)")


def test_the_default_is_feasible_where_filters_spread_and_falls_back_otherwise() -> None:
    # σ0 ≈ 40 bits (the sklearn task's Bloom filters): τ = DEFAULT_TAU is reachable
    assert tau_min(40.0) < DEFAULT_TAU
    rng = np.random.default_rng(0)
    wide = rng.integers(0, 200, size=(300, 5)).astype(float)
    few = rng.integers(0, 3, size=(300, 5)).astype(float)  # spread of a bit or two

    idx = np.tile(np.arange(5), (300, 1))
    lk = soft_linkage(Neighbours(idx, np.sort(wide, axis=1), exact=True), metric="hamming",
                      n_secondary=5, tau=DEFAULT_TAU, sigma=DEFAULT_FALLBACK_SIGMA, rng=0)
    assert lk.tau == pytest.approx(DEFAULT_TAU)
    lk = soft_linkage(Neighbours(idx, np.sort(few, axis=1), exact=True), metric="hamming",
                      n_secondary=5, tau=DEFAULT_TAU, sigma=DEFAULT_FALLBACK_SIGMA, rng=0)
    assert lk.sigma == DEFAULT_FALLBACK_SIGMA
    assert lk.tau == pytest.approx(tau_for_sigma(DEFAULT_FALLBACK_SIGMA, lk.sigma0))
    assert lk.tau < 1.0


def _filters(bits: list[int], width: int = 64) -> np.ndarray:
    """Packed Bloom filters with the first ``b`` bits of each row set."""
    rows = np.zeros((len(bits), width), dtype=np.uint8)
    for i, b in enumerate(bits):
        rows[i, :b] = 1
    return np.packbits(rows, axis=1)


def test_field_resolution_is_one_bit_of_the_easiest_field() -> None:
    specs = (FieldSpec(on=("a",), metric="hamming", weight=1.0),
             FieldSpec(on=("b",), metric="hamming", weight=3.0))
    p = FieldValues((_filters([10, 12, 14]), _filters([30, 30, 40])))
    s = FieldValues((_filters([20, 20, 20, 0]), _filters([10, 50, 50, 50])))
    # median set bits: field a 12 + 20 = 32, field b 30 + 50 = 80 (empty filters left out);
    # one bit moves D by w_f / (W·(|a|+|b|)): 1/(4·32) and 3/(4·80)
    expected = max(1.0 / (4 * 32), 3.0 / (4 * 80))
    assert field_resolution(specs, (1.0, 1.0), p, s) == pytest.approx(expected)
    assert search_fields(specs, p, s, 2).resolution == pytest.approx(expected)
    assert brute_fields(specs, p, s, 2).resolution == pytest.approx(expected)


def test_field_resolution_of_fields_in_clear() -> None:
    specs = (FieldSpec(on=("name",), metric="levenshtein", weight=1.0),
             FieldSpec(on=("x",), metric="euclidean", weight=1.0, scale=2.0))
    p = FieldValues((["abcd", "abcdef"], np.array([[0.0], [1.0]])))
    s = FieldValues((["abcdefgh", "abcdefgh"], np.array([[0.0], [5.0]])))
    # one character of a ~(5 + 8)/2-character string, or 1/(4·scale) of the number, × w/W
    expected = 0.5 * max(1.0 / 6.5, 1.0 / 8.0)
    assert field_resolution(specs, (1.0, 2.0), p, s) == pytest.approx(expected)
