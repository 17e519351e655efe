"""Verdict words for an attack AUC: judged by distance from 0.5 and direction."""

from __future__ import annotations

import math

import pytest

from vflink.metrics.attacks import auc_verdict


@pytest.mark.parametrize("auc", [0.0, 0.05, 0.25, 0.39, 0.45, 0.5, 0.52, 0.7, 0.99])
def test_an_auc_and_its_mirror_get_the_same_size(auc: float) -> None:
    """An attacker who flips the scores turns AUC a into 1 − a: the leak is as large."""
    low, high = auc_verdict(min(auc, 1 - auc)), auc_verdict(max(auc, 1 - auc))
    assert low.split(" (")[0] == high.split(" (")[0]
    assert f"{abs(auc - 0.5):.2f} from chance" in low


SIZES = [(0.5, "no measurable leak"), (0.53, "no measurable leak"), (0.61, "a small leak"),
         (0.39, "a small leak"), (0.8, "a substantial leak"), (0.15, "a substantial leak"),
         (0.95, "practically visible"), (0.02, "practically visible")]


@pytest.mark.parametrize(("auc", "size"), SIZES)
def test_sizes(auc: float, size: str) -> None:
    assert size in auc_verdict(auc)


def test_below_chance_is_called_inverted_with_the_flipped_value() -> None:
    text = auc_verdict(0.39)
    assert "inverted" in text and "AUC 0.61" in text and "guess" not in text
    assert "inverted" not in auc_verdict(0.61)
    assert "inverted" not in auc_verdict(0.48)  # within noise of chance: no direction claimed


def test_nan() -> None:
    assert "no AUC" in auc_verdict(math.nan)
