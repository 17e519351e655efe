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


def test_auc_stderr_is_hanley_mcneils_and_matches_resampling() -> None:
    import numpy as np
    from sklearn.metrics import roc_auc_score

    from vflink.metrics.attacks import auc_stderr

    # Hanley & McNeil (1982), Eq. 2, by hand: A = 0.9, 50 positives and 50 negatives
    assert auc_stderr(0.9, 50, 50) == pytest.approx(0.03212, abs=1e-4)
    rng = np.random.default_rng(0)
    values = []
    for _ in range(400):  # binormal scores with AUC ≈ 0.8, 40 positives, 160 negatives
        pos, neg = rng.normal(1.19, 1, 40), rng.normal(0, 1, 160)
        values.append(roc_auc_score(np.r_[np.ones(40), np.zeros(160)], np.r_[pos, neg]))
    assert auc_stderr(float(np.mean(values)), 40, 160) == pytest.approx(np.std(values),
                                                                         rel=0.2)
    assert math.isnan(auc_stderr(0.7, 0, 10))
