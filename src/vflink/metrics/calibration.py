"""Calibration metrics: adaptive calibration error (ACE; Nixon et al. 2019, "Measuring
Calibration in Deep Learning", §4), which FLORIST uses to measure how synthetic labels and
features distort predicted probabilities (§2.4, §3).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["adaptive_calibration_error"]


def adaptive_calibration_error(y_true: npt.ArrayLike, p_positive: npt.ArrayLike, *,
                               bins: int = 15) -> float:
    """ACE of a binary classifier.

    For each class k ∈ {0, 1} the predictions' probabilities of k are sorted and cut into
    ``bins`` ranges holding equally many predictions (adaptive ranges, Nixon et al. Eq. 4);
    ACE = 1/(K·R) Σ_k Σ_r |acc(r, k) − conf(r, k)|, with acc the fraction of the range whose
    label is k and conf its mean probability of k.
    """
    y = np.asarray(y_true).astype(np.int64).ravel()
    p1 = np.clip(np.asarray(p_positive, dtype=np.float64).ravel(), 0.0, 1.0)
    if y.shape != p1.shape or y.size == 0:
        raise ValueError(f"labels and probabilities must be non-empty and aligned, got "
                         f"{y.shape} and {p1.shape}")
    if bins < 1:
        raise ValueError(f"`bins` must be ≥ 1, got {bins}")
    total = 0.0
    for k, prob in ((0, 1.0 - p1), (1, p1)):
        order = np.argsort(prob, kind="stable")
        for part in np.array_split(order, min(bins, y.size)):
            total += abs(float(np.mean(y[part] == k)) - float(np.mean(prob[part])))
    return total / (2 * min(bins, y.size))
