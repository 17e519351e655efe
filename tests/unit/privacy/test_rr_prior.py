"""RRWithPrior (Ghazi et al., NeurIPS 2021, Algorithm 2): k*, the output law, the primary's use."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vflink.privacy.budget import ReleaseBudget
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.label_protection import LabelProtection
from vflink.privacy.rr_prior import best_top_k, rr_with_prior, uniform_prior
from vflink.types import Task


def test_best_top_k_against_its_objective() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        prior = rng.dirichlet(np.ones(6) * rng.uniform(0.1, 3))
        eps = float(rng.uniform(0.1, 6))
        k, top = best_top_k(prior, eps)
        order = np.argsort(-prior, kind="stable")
        values = [math.exp(eps) / (math.exp(eps) + j - 1) * prior[order[:j]].sum()
                  for j in range(1, 7)]
        assert values[k - 1] == pytest.approx(max(values))
        assert sorted(top.tolist()) == sorted(order[:k].tolist())
    # a uniform prior: k-ary randomized response over every class
    assert best_top_k(np.full(5, 0.2), 1.0)[0] == 5
    assert best_top_k(np.array([0.98, 0.01, 0.01]), 1.0)[0] == 1  # a confident prior


def test_keep_probability_and_the_other_classes_follow_the_formula() -> None:
    """Statistical, fixed seeds: the true label kept with e^ε/(e^ε + k − 1), each other
    class of the set with 1/(e^ε + k − 1)."""
    n = 200_000
    gen = torch.Generator().manual_seed(0)
    for k, eps in ((2, 1.0), (4, 2.0)):
        y = np.zeros(n, dtype=np.int64)
        out = rr_with_prior(y, uniform_prior(n, k), eps, generator=gen)
        freq = np.bincount(out, minlength=k) / n
        keep = math.exp(eps) / (math.exp(eps) + k - 1)
        assert freq[0] == pytest.approx(keep, abs=4e-3)
        assert freq[1:] == pytest.approx([(1 - keep) / (k - 1)] * (k - 1), abs=4e-3)
    # a label outside the top-k set: uniform over the set
    prior = np.tile([0.7, 0.25, 0.05], (n, 1))
    k, top = best_top_k(prior[0], 0.5)
    assert 2 not in top
    out = rr_with_prior(np.full(n, 2), prior, 0.5, generator=gen)
    freq = np.bincount(out, minlength=3) / n
    assert freq[top] == pytest.approx([1 / k] * k, abs=4e-3) and freq[2] == 0


def test_the_primary_randomises_its_training_labels_once() -> None:
    settings = {**PrivacyConfig(labels="rr-prior", labels_total_epsilon=1.0).label_settings(),
                "seed": 3}
    budget = ReleaseBudget(5000, party="bank")
    p = LabelProtection(settings, task=Task.BINARY, party="bank", n_rows=5000, classes=2,
                        budget=budget)
    y = torch.from_numpy((np.arange(5000) % 2).astype(np.float32))
    train = np.arange(4000)
    out = p.randomize(y, train)
    changed = float((out[:4000] != y[:4000]).float().mean())
    assert changed == pytest.approx(1 / (math.e + 1), abs=0.02)
    assert torch.equal(out[4000:], y[4000:])  # labels that never train stay as they are
    assert budget.totals[:4000].tolist() == [1] * 4000 and budget.totals[4000:].sum() == 0
    entry = p.report()
    assert entry["kind"] == "label-rr-prior"
    assert 0.999 <= entry["guarantee"]["epsilon"] <= 1.0  # pure ε (read at δ = 1e-5: ≤ ε)
    # a resumed run trains on the same randomised labels, with no new release
    resumed = LabelProtection(settings, task=Task.BINARY, party="bank", n_rows=5000,
                              classes=2, budget=budget)
    resumed.load_state_dict(p.state_dict())
    assert torch.equal(resumed.randomize(y, train), out)
    assert budget.totals.max() == 1
