"""FLORIST's synthetic rows and logits shift (§2.4, §3, App. E-H) against hand-computed oracles."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.alignment import synthetic as syn
from vflink.errors import UnknownNameError


def ctx(n: int, **kw: object) -> syn.LabelContext:
    return syn.LabelContext(n=n, positive_rate=kw.pop("rate", 0.1),  # type: ignore[arg-type]
                            generator=torch.Generator().manual_seed(0), **kw)  # type: ignore[arg-type]


def test_registries_hold_the_paper_names() -> None:
    assert set(syn.LABEL_STRATEGIES.names()) == {
        "label-majority", "label-minority", "label-random-pos", "label-random-pred",
        "label-neighbors"}
    assert set(syn.FEATURE_STRATEGIES.names()) == {"fea-sampling", "fea-gaussian", "fea-random"}
    for name in ("baseline-full", "baseline-partial", "label-majority-tr", "label-majority-te",
                 "fea-sampling-tr", "fea-sampling-te", "florist", "florist-vanilla"):
        assert name in syn.STRATEGIES
    with pytest.raises(UnknownNameError, match="label-majority"):
        syn.get_strategy("label-mayority")


def test_majority_minority_and_random_pos() -> None:
    maj = syn.LABEL_STRATEGIES.get("label-majority")
    assert maj(ctx(5)).tolist() == [0.0] * 5
    assert maj(ctx(3, rate=0.8)).tolist() == [1.0] * 3
    assert syn.LABEL_STRATEGIES.get("label-minority")(ctx(4)).tolist() == [1.0] * 4
    draws = syn.LABEL_STRATEGIES.get("label-random-pos")(ctx(20000, rate=0.25))
    assert abs(float(draws.mean()) - 0.25) < 0.02


def test_random_pred_follows_the_prediction_and_averages_samples() -> None:
    p = torch.tensor([0.0, 1.0, 0.5])
    one = syn.LABEL_STRATEGIES.get("label-random-pred")(ctx(3, probabilities=p))
    assert one[0] == 0.0 and one[1] == 1.0
    many = syn.LABEL_STRATEGIES.get("label-random-pred")(
        ctx(3, probabilities=p, samples=4000))
    assert abs(float(many[2]) - 0.5) < 0.05  # App. H: the mean of the draws


def test_neighbors_is_a_cosine_knn_vote() -> None:
    ref = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.8, 0.3], [0.0, 1.0], [-1.0, 0.2]])
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0])
    q = torch.tensor([[2.0, 0.1], [0.1, 3.0]])
    # brute force: the 3 largest cosine similarities, majority vote
    qn = q / q.norm(dim=1, keepdim=True)
    rn = ref / ref.norm(dim=1, keepdim=True)
    expect = [float(labels[(qn[i] @ rn.T).argsort(descending=True)[:3]].mean() > 0.5)
              for i in range(2)]
    assert syn.knn_labels(q, ref, labels).tolist() == expect == [1.0, 0.0]


def test_feature_generators() -> None:
    rng = np.random.default_rng(0)
    own = np.array([3, 7, 9])
    assert set(syn.sampled_rows(own, 50, rng)) <= {3, 7, 9}
    real = torch.tensor([[3.0, 4.0], [0.0, 1.0]])  # max norm 5, d = 2: std 5/sqrt(2)
    g = syn.gaussian_embeddings(real, 40000, torch.Generator().manual_seed(1))
    assert abs(float(g.std()) - 5 / np.sqrt(2)) < 0.05 and abs(float(g.mean())) < 0.05
    stats = syn.EmbeddingStats()
    stats.update(torch.tensor([[1.0, 10.0], [3.0, 14.0]]))
    r = syn.moving_average_embeddings(stats, 40000, 2, torch.Generator().manual_seed(2))
    assert torch.allclose(r.mean(0), torch.tensor([2.0, 12.0]), atol=0.05)


@settings(max_examples=50, deadline=None)
@given(p_a=st.floats(0.05, 1.0), p_p=st.floats(0.05, 1.0), pi=st.floats(0.0, 0.5),
       p=st.floats(0.0, 1.0), labels=st.booleans(), features=st.booleans())
def test_logits_shift_round_trip(p_a: float, p_p: float, pi: float, p: float, labels: bool,
                                 features: bool) -> None:
    c = syn.Calibration.for_synthetic(labels=labels, features=features, p_a=p_a, p_p=p_p,
                                      positive_rate=pi)
    # Eq. 1-3 by hand
    a, b = {(True, True): (p_a * p_p, p_a * (1 - p_p) * pi), (True, False): (p_a, 0.0),
            (False, True): (p_p, (1 - p_p) * pi), (False, False): (1.0, 0.0)}[labels, features]
    assert (c.a, c.b) == pytest.approx((a, b))
    shifted = syn.shift_for_training(torch.tensor([p], dtype=torch.float64), c)
    back = syn.shift_for_test(shifted.numpy(), c)
    if 1e-6 < a * p + b < 1 - 1e-6:
        assert back[0] == pytest.approx(p, abs=1e-6)
