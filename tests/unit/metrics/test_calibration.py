"""ACE (Nixon et al. 2019) against a hand-computed example."""

from __future__ import annotations

import numpy as np
import pytest

from vflink.metrics.calibration import adaptive_calibration_error


def test_hand_computed_two_bins() -> None:
    y = np.array([0, 0, 1, 1])
    p = np.array([0.1, 0.2, 0.6, 0.9])
    # class 1, probs sorted [0.1, 0.2 | 0.6, 0.9]: |0 - 0.15| + |1 - 0.75| = 0.4
    # class 0, probs (1-p) sorted [0.1, 0.4 | 0.8, 0.9] -> labels==0 [0, 0 | 1, 1]:
    #   |0 - 0.25| + |1 - 0.85| = 0.4
    assert adaptive_calibration_error(y, p, bins=2) == pytest.approx(0.8 / 4)


def test_perfect_calibration_is_near_zero_and_overconfidence_is_not() -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(size=200000)
    y = (rng.uniform(size=p.size) < p).astype(int)
    assert adaptive_calibration_error(y, p) < 0.01
    assert adaptive_calibration_error(y, np.clip(p * 0.3, 0, 1)) > 0.1
