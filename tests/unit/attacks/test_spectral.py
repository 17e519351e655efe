"""The spectral attack (FLORIST App. C): separated clusters are found, identical ones are not."""

from __future__ import annotations

import numpy as np
import pytest

from vflink.attacks import ATTACKS, AttackView, get_attack
from vflink.attacks.spectral import spectral_scores


def test_registered_under_the_contract() -> None:
    assert "spectral" in ATTACKS
    attack = get_attack("spectral", target="embeddings")
    assert attack.name == "spectral" and "extra" in attack.needs


def test_scores_are_projections_on_the_top_singular_vector() -> None:
    x = np.array([[1.0, 0.0], [-1.0, 0.0], [3.0, 0.0], [-3.0, 0.0]])
    assert spectral_scores(x) == pytest.approx([1.0, 1.0, 3.0, 3.0])


def test_auc_high_for_shifted_synthetic_rows_and_chance_for_same_distribution() -> None:
    rng = np.random.default_rng(0)
    real = rng.normal(size=(200, 8))
    batches = [np.arange(i, i + 100) for i in (0, 100)]
    synthetic = np.zeros(200, dtype=bool)
    synthetic[80:100] = synthetic[180:200] = True  # ε = 0.2 < 1/2 (Lemma 1)
    shifted = real.copy()
    shifted[synthetic] += 6.0 / np.sqrt(8)  # mean far from the real rows' (Lemma 1)
    attack = get_attack("spectral", target="gradients")
    high = attack.evaluate(AttackView(party="p", role="secondary", gradients=shifted,
                                      extra={"batches": batches}), {"synthetic": synthetic})
    assert high.metrics["auc"] > 0.95
    same = attack.evaluate(AttackView(party="p", role="secondary", gradients=real,
                                      extra={"batches": batches}), {"synthetic": synthetic})
    assert abs(same.metrics["auc"] - 0.5) < 0.15
