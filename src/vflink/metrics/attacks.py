"""Leakage metrics: how well an attack's scores recover a secret, as pure functions.

They sit with the task metrics (:mod:`vflink.metrics.functional`) so an attack is scored the
way a model is (ARCHITECTURE.md, convention 10).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from vflink.metrics.functional import auc

__all__ = ["auc_stderr", "auc_verdict", "grouped_auc", "success_rate", "success_stderr"]


def grouped_auc(y_true: npt.ArrayLike, scores: npt.ArrayLike, groups: npt.ArrayLike
                ) -> tuple[float, int]:
    """Mean ROC AUC over groups (e.g. training batches), weighted by group size.

    Scores from different batches are on different scales (the model moves between them), so
    Li et al. (ICLR 2022, §5) measure leak AUC per batch. Groups with a single class have no AUC
    and are skipped; returns (AUC, number of groups used), NaN when none qualifies.
    """
    y = np.asarray(y_true)
    s = np.asarray(scores, dtype=np.float64)
    g = np.asarray(groups)
    total, weight, used = 0.0, 0, 0
    for key in np.unique(g):
        m = g == key
        a = auc(y[m], s[m])
        if not math.isnan(a):
            total += a * int(m.sum())
            weight += int(m.sum())
            used += 1
    return (total / weight if weight else math.nan), used


def success_rate(hits: npt.ArrayLike) -> float:
    """Fraction of successful attempts (NaN for none)."""
    h = np.asarray(hits, dtype=np.float64)
    return float(h.mean()) if h.size else math.nan


def success_stderr(rate: float, n: int) -> float:
    """Binomial standard error √(p(1−p)/n) of a measured success rate."""
    if n <= 0 or math.isnan(rate):
        return math.nan
    return math.sqrt(max(rate * (1.0 - rate), 0.0) / n)


def auc_stderr(value: float, positives: int, negatives: int) -> float:
    """The standard error of an AUC measured on ``positives`` and ``negatives`` (Hanley &
    McNeil, Radiology 1982, Eq. 2: Q₁ = A/(2 − A), Q₂ = 2A²/(1 + A)); NaN without both."""
    a = float(value)
    n1, n0 = int(positives), int(negatives)
    if n1 < 1 or n0 < 1 or not math.isfinite(a):
        return math.nan
    q1, q2 = a / (2.0 - a), 2.0 * a * a / (1.0 + a)
    var = (a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n0 - 1) * (q2 - a * a)) / (n1 * n0)
    return math.sqrt(max(var, 0.0))


def auc_verdict(value: float) -> str:
    """Plain words for an attack AUC, judged by its distance from chance (0.5) and direction.

    An AUC of 0.39 is as far from chance as 0.61: an attacker who learns (from a handful of
    known labels, or from the task's class balance) that the scores run the wrong way flips
    them and reads the secret just as well. So the size of a leak is ``|AUC − 0.5|`` and an
    AUC below 0.5 is called inverted, never "about as good as guessing".
    """
    if math.isnan(value):
        return "no AUC could be measured"
    distance = round(abs(value - 0.5), 9)  # 0.45 and 0.55 sit equally far from chance
    if distance < 0.05:
        size = "no measurable leak"
    elif distance < 0.2:
        size = "a small leak"
    elif distance < 0.4:
        size = "a substantial leak"
    else:
        size = "the secret is practically visible"
    where = f"{distance:.2f} from chance"
    if value < 0.5 and distance >= 0.05:
        return (f"{size} ({where}, inverted: the scores rank the other way, and flipped they "
                f"reach AUC {1.0 - value:.2f})")
    return f"{size} ({where})"
