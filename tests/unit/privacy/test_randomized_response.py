"""Randomized response on a SimHash code, released once: the mechanism against its
formula, its accounting against closed forms and an exact enumeration, and the party-side
wrapper's cache, budget and ledger."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest
import torch
from scipy.optimize import brentq

from vflink.errors import ConfigError, PrivacyBudgetExceeded
from vflink.privacy import randomized_response as rr
from vflink.privacy.accounting import composed_epsilon_with_responses, max_responses_within
from vflink.privacy.budget import ReleaseBudget
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.embedding_dp import EmbeddingDP
from vflink.randomness import NoiseSource

PLAN = {"epochs": 5, "train_batches": 3, "train_chunks": 1, "validation_chunks": 1,
        "test_chunks": 1}


def _binomial_bound(p: float, n: int, z: float = 5.0) -> float:
    """z standard deviations of a binomial proportion: a seeded draw outside it would be a
    one-in-3.5-million event under the formula."""
    return z * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize(("k", "eps"), [(2, 0.5), (8, 1.0), (128, 8.0)])
def test_keep_rate_and_the_other_codes_follow_the_formula(k: int, eps: float,
                                                          secure: bool) -> None:
    n = 200_000
    codes = np.random.default_rng(0).integers(0, k, n)
    out = rr.randomized_response(codes, k, eps, NoiseSource() if secure
                                 else torch.Generator().manual_seed(1))
    p = math.exp(eps) / (math.exp(eps) + k - 1)  # the formula, written out
    assert rr.keep_probability(eps, k) == pytest.approx(p)
    assert out.min() >= 0 and out.max() < k
    kept = float(np.mean(out == codes))
    assert abs(kept - p) <= _binomial_bound(p, n)
    # a changed code is uniform over the other k − 1: shift it so the true code is 0
    moved = (out - codes)[out != codes] % k
    assert moved.min() >= 1
    if k <= 8:
        freq = np.bincount(moved, minlength=k)[1:] / moved.size
        q = 1.0 / (k - 1)
        assert np.all(np.abs(freq - q) <= _binomial_bound(q, moved.size))


def test_draws_are_determined_by_the_seed() -> None:
    codes = np.arange(1000) % 16
    a = rr.randomized_response(codes, 16, 1.0, torch.Generator().manual_seed(7))
    b = rr.randomized_response(codes, 16, 1.0, torch.Generator().manual_seed(7))
    c = rr.randomized_response(codes, 16, 1.0, torch.Generator().manual_seed(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_simhash_is_data_independent_and_scale_free() -> None:
    planes = rr.simhash_planes(5, 3, seed=4)
    assert torch.equal(planes, rr.simhash_planes(5, 3, seed=4))  # seed and shape only
    assert not torch.equal(planes, rr.simhash_planes(5, 3, seed=5))
    x = torch.randn(200, 5, generator=torch.Generator().manual_seed(0))
    codes = rr.simhash_codes(x, planes)
    assert codes.min() >= 0 and codes.max() < 8
    # the oracle: bit j is the side of hyperplane j
    expected = sum(((x @ planes[:, j]) >= 0).long().numpy() << j for j in range(3))
    assert np.array_equal(codes, expected)
    assert np.array_equal(rr.simhash_codes(3.5 * x, planes), codes)  # through the origin
    assert len(set(codes.tolist())) > 4  # the rows spread over the codes
    with pytest.raises(ValueError, match="bits"):
        rr.simhash_planes(5, 0, seed=0)


@pytest.mark.parametrize(("k", "eps"), [(2, 0.3), (16, 1.0), (128, 8.0), (4096, 16.0)])
def test_closed_form_epsilon_and_the_accountant_agree(k: int, eps: float) -> None:
    keep = rr.keep_probability(eps, k)
    # ε of k-ary RR = ln((k − 1)·p/(1 − p))
    assert math.log((k - 1) * keep / (1 - keep)) == pytest.approx(eps, rel=1e-9)
    assert rr.code_epsilon(keep, k) == pytest.approx(eps, rel=1e-9)
    # dp-accounting's noise parameter q: keep = 1 − q + q/k
    q = rr.noise_parameter(eps, k)
    assert 1 - q + q / k == pytest.approx(keep, rel=1e-9)
    # one release: exactly ε (never above it) at any δ
    for delta in (0.0, 1e-5):
        assert composed_epsilon_with_responses((), (((k, eps), 1),), delta) <= eps
        assert composed_epsilon_with_responses((), (((k, eps), 1),), delta) == \
            pytest.approx(eps, abs=2e-3)
    assert max_responses_within(k, eps, 1e-5, eps) == 1


def _exact_rr_composition(k: int, eps: float, m: int, delta: float) -> float:
    """ε at δ of m releases of ε-DP k-ary RR, by enumerating the privacy loss: per release the
    loss is +ε (the output is x's code, prob p), −ε (x′'s code, prob (1 − p)/(k − 1)) or 0;
    δ(ε′) = E[(1 − e^(ε′ − L))₊] over the m-fold sum L (an independent oracle)."""
    p = rr.keep_probability(eps, k)
    law = [(eps, p), (-eps, (1 - p) / (k - 1)), (0.0, 1 - p - (1 - p) / (k - 1))]
    outcomes = []
    for combo in product(law, repeat=m):
        outcomes.append((sum(v for v, _ in combo), math.prod(w for _, w in combo)))

    def gap(e: float) -> float:
        return sum(w * max(0.0, 1 - math.exp(e - loss)) for loss, w in outcomes) - delta

    return 0.0 if gap(0.0) <= 0 else float(brentq(gap, 0.0, m * eps + 1, xtol=1e-12))


@pytest.mark.parametrize(("k", "eps", "m"), [(16, 1.0, 2), (8, 2.0, 3), (128, 8.0, 2)])
def test_composition_of_responses_against_exact_enumeration(k: int, eps: float, m: int) -> None:
    exact = _exact_rr_composition(k, eps, m, 1e-5)
    ours = composed_epsilon_with_responses((), (((k, eps), m),), 1e-5)
    assert ours >= exact - 1e-9  # never below the truth (pessimistic discretisation)
    assert ours == pytest.approx(exact, abs=5e-3)
    assert ours <= m * eps  # and never above basic composition


def _rr(n: int = 6, total: float = 8.0, bits: int = 3, budget: ReleaseBudget | None = None,
        seed: int = 0) -> EmbeddingDP:
    dp = EmbeddingDP(PrivacyConfig(embeddings="randomized-response", total_epsilon=total,
                                   delta=1e-5, code_bits=bits),
                     party="bank", n_rows=n, seed=seed, budget=budget)
    dp.note_links(np.ones(n, dtype=np.int64))
    dp.set_plan(PLAN)
    return dp


def test_each_record_is_released_once_and_repeats_get_the_same_release() -> None:
    dp = _rr()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    _, first = dp.release(torch.randn(3, 5), np.array([0, 1, 2]), x[[0, 1, 2]])
    assert first.shape == (3, 8) and torch.equal(first.sum(dim=1), torch.ones(3))
    for _ in range(4):  # later epochs and evaluations: the cached release, no new cost
        _, again = dp.release(torch.randn(2, 5), np.array([2, 0]), x[[2, 0]])
        assert torch.equal(again, first[[2, 0]])
    _, more = dp.release(torch.randn(3, 5), np.array([4, 1, 3]), x[[4, 1, 3]])
    assert torch.equal(more[1], first[1])
    assert list(dp.budget.totals) == [1, 1, 1, 1, 1, 0]  # the budget is charged once
    assert list(dp.counts) == [1, 1, 1, 1, 1, 0]


def test_same_seed_same_releases_and_the_state_keeps_them() -> None:
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    rows = np.arange(6)
    a = _rr(seed=3).release(torch.zeros(6, 2), rows, x)[1]
    dp = _rr(seed=3)
    b = dp.release(torch.zeros(6, 2), rows, x)[1]
    assert torch.equal(a, b)
    # a resumed run answers from the saved codes and is charged nothing more
    resumed = _rr(seed=3, budget=dp.budget)
    resumed.load_state_dict(dp.state_dict())
    c = resumed.release(torch.zeros(6, 2), rows[::-1].copy(), x.flip(0))[1]
    assert torch.equal(c, b.flip(0))
    assert list(dp.budget.totals) == [1] * 6


def test_the_ledger_worst_case_is_the_total_recomputed_from_its_figures() -> None:
    dp = _rr(total=4.0, bits=4)
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        dp.release(torch.zeros(6, 2), np.arange(6), x)
    entry = dp.report()
    p, g = entry["params"], entry["guarantee"]
    assert p["mechanism"] == "k-ary randomized response" and p["k"] == 16
    # independently: ln((k − 1)·p/(1 − p)) per release, times the releases of the worst record
    keep, k, m = p["keep_probability"], p["k"], g["max_releases"]
    assert m == 1 and g["planned"]["max_releases"] == 1
    eps = m * math.log((k - 1) * keep / (1 - keep))
    assert eps <= 4.0 + 1e-9 and eps == pytest.approx(4.0)
    assert g["epsilon_total"] <= 4.0 and g["spent"]["epsilon"] <= 4.0
    assert g["delta_total"] == 0.0  # pure ε-DP
    assert g["planned"]["plan"] == PLAN


def test_a_second_run_on_the_same_data_is_refused_once_the_total_is_spent() -> None:
    first = _rr(total=2.0)
    x = torch.randn(6, 3)
    first.release(torch.zeros(6, 2), np.arange(6), x)
    second = _rr(total=2.0, budget=first.budget)
    before = first.budget.totals.copy()
    with pytest.raises(PrivacyBudgetExceeded, match="total_epsilon"):
        second.release(torch.zeros(2, 2), np.array([0, 1]), x[:2])
    assert np.array_equal(first.budget.totals, before)  # nothing counted, nothing sent


def test_earlier_gaussian_releases_lower_the_response_epsilon() -> None:
    budget = ReleaseBudget(6, party="bank")
    vanilla = EmbeddingDP(PrivacyConfig(embeddings="vanilla", epsilon=1.0, delta=1e-5),
                          party="bank", n_rows=6, seed=0, budget=budget)
    vanilla.release(torch.ones(6, 2), np.arange(6))
    dp = _rr(total=4.0, budget=budget)
    dp.release(torch.zeros(6, 2), np.arange(6), torch.randn(6, 3))
    eps = dp.report()["guarantee"]["epsilon_per_release"]
    assert 2.5 < eps < 4.0  # the Gaussian release's ε = 1 is paid for
    assert budget.max_epsilon(1e-5) <= 4.0 + 1e-9
    assert budget.max_epsilon(1e-5) == pytest.approx(4.0, abs=1e-3)


def test_features_are_required() -> None:
    dp = _rr()
    with pytest.raises(ConfigError, match="feature rows"):
        dp.release(torch.zeros(2, 2), np.array([0, 1]))


@pytest.mark.parametrize(("kw", "key"), [
    ({"code_bits": 0}, "privacy.code_bits"),
    ({"code_bits": 13}, "privacy.code_bits"),
    ({"code_bits": 2.5}, "privacy.code_bits"),
    ({"code_bits": True}, "privacy.code_bits"),
    ({"embeddings": "vanilla", "code_bits": 4}, "privacy.code_bits"),
    ({"total_epsilon": None, "epsilon": 8.0}, "privacy.total_epsilon"),
    ({"reserve_releases": 2}, "privacy.reserve_releases"),
])
def test_config_errors_name_the_key(kw: dict[str, object], key: str) -> None:
    base: dict[str, object] = {"embeddings": "randomized-response", "total_epsilon": 8.0}
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        PrivacyConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_the_cut_width_is_the_number_of_codes() -> None:
    cfg = PrivacyConfig(embeddings="randomized-response", total_epsilon=8.0, code_bits=5)
    assert cfg.codes == 32 and cfg.cut_width(16) == 32
    assert PrivacyConfig(embeddings="randomized-response", total_epsilon=8.0).codes == 2**8
    assert PrivacyConfig(embeddings="vanilla", epsilon=1.0).cut_width(16) == 16
