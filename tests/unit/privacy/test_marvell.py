"""Marvell's solver against brute force and SLSQP, its closed form, its noise; max-norm."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from vflink.privacy.marvell import (
    batch_statistics,
    leak_auc_bound,
    marvell_noise,
    max_norm_noise,
    solve_marvell,
    sum_kl,
    zero_variance_solution,
)


def brute_force(u: float, v: float, d: int, g: float, p: float, power: float,
                n: int = 24) -> float:
    """The least sum of KL over a grid of all four λ (both classes may get perpendicular
    noise), each point spending the whole power budget (λ₁₁ takes what the others leave)."""
    best = math.inf
    grid = np.linspace(0.0, 1.0, n)
    for a, c, f in itertools.product(grid * power / (1 - p), grid * power / (1 - p) / d,
                                     grid * power / p / d):
        if c > a:
            continue
        b = (power - (1 - p) * (a + (d - 1) * c) - p * (d - 1) * f) / p
        if b < f:
            continue
        best = min(best, sum_kl(a, c, b, f, u=u, v=v, d=d, g=g))
    return best


def slsqp(u: float, v: float, d: int, g: float, p: float, power: float) -> float:
    """A general solver over all four λ from several starts."""
    def f(x: np.ndarray) -> float:
        value = sum_kl(*np.maximum(x, 0.0), u=u, v=v, d=d, g=g)
        return value if math.isfinite(value) else 1e9

    cons = [{"type": "ineq", "fun": lambda x: power - (p * (x[2] + (d - 1) * x[3])
                                                      + (1 - p) * (x[0] + (d - 1) * x[1]))},
            {"type": "ineq", "fun": lambda x: x[0] - x[1]},
            {"type": "ineq", "fun": lambda x: x[2] - x[3]}]
    best = math.inf
    for start in ([power, 0, power, 0], [power / 2, power / (4 * d), power / 2, 0],
                  [power / 2, 0, power / 2, power / (4 * d)]):
        res = minimize(f, np.array(start, dtype=float), method="SLSQP",
                       bounds=[(0, None)] * 4, constraints=cons)
        best = min(best, f(res.x))
    return best


CASES = [(float(u), float(v), int(d), float(g), float(p), float(s))
         for u, v, d, g, p, s in zip(
             np.random.default_rng(0).uniform(0.0, 0.5, 8),
             np.random.default_rng(1).uniform(0.0, 0.5, 8),
             np.random.default_rng(2).integers(2, 4, 8),
             np.random.default_rng(3).uniform(0.1, 1.0, 8),
             np.random.default_rng(4).uniform(0.05, 0.5, 8),
             np.random.default_rng(5).uniform(0.2, 4.0, 8), strict=True)]


@pytest.mark.parametrize(("u", "v", "d", "g", "p", "s"), CASES)
def test_solver_is_at_least_as_good_as_brute_force_and_slsqp(u: float, v: float, d: int,
                                                              g: float, p: float,
                                                              s: float) -> None:
    power = s * g
    sol = solve_marvell(u, v, d, g, p, power)
    assert sol.sum_kl <= brute_force(u, v, d, g, p, power) + 1e-9
    assert sol.sum_kl <= slsqp(u, v, d, g, p, power) + 1e-6
    # feasible: the power budget, and each class's covariance positive semi-definite
    assert sol.power(p, d) <= power * (1 + 1e-9)
    assert 0 <= sol.lam20 <= sol.lam10 + 1e-12 and 0 <= sol.lam21 <= sol.lam11 + 1e-12
    assert sol.sum_kl == pytest.approx(sum_kl(sol.lam10, sol.lam20, sol.lam11, sol.lam21,
                                              u=u, v=v, d=d, g=g))


def test_the_zero_variance_closed_form() -> None:
    """u = v = 0: the paper's closed form, against a 1-D search on the power line."""
    for g, p, s in ((1.0, 0.1, 4.0), (0.3, 0.45, 0.5), (2.0, 0.02, 1.0)):
        power = s * g
        sol = zero_variance_solution(g, p, power)
        assert p * sol.lam11 + (1 - p) * sol.lam10 == pytest.approx(power)
        grid = np.linspace(1e-6, power / (1 - p) - 1e-6, 200_001)
        values = [(a + g) / ((power - (1 - p) * a) / p) + ((power - (1 - p) * a) / p + g) / a
                  for a in grid]
        assert sol.sum_kl == pytest.approx(0.5 * min(values) - 1.0, abs=1e-6)
        assert solve_marvell(0.0, 0.0, 7, g, p, power).sum_kl == pytest.approx(sol.sum_kl)


def test_scale_free_and_more_power_means_less_leak() -> None:
    base = solve_marvell(0.2, 0.3, 4, 0.5, 0.2, 1.0)
    scaled = solve_marvell(0.2e-8, 0.3e-8, 4, 0.5e-8, 0.2, 1.0e-8)
    assert scaled.sum_kl == pytest.approx(base.sum_kl, rel=1e-6)
    assert scaled.lam10 == pytest.approx(base.lam10 * 1e-8, rel=1e-5)
    kls = [solve_marvell(0.2, 0.3, 4, 0.5, 0.2, s * 0.5).sum_kl for s in (0.1, 1, 4, 16)]
    assert all(a > b for a, b in itertools.pairwise(kls))
    assert solve_marvell(0.2, 0.3, 4, 0.5, 0.2, 0.0).sum_kl == pytest.approx(
        sum_kl(0, 0, 0, 0, u=0.2, v=0.3, d=4, g=0.5))


def test_leak_auc_bound() -> None:
    assert leak_auc_bound(0.0) == 0.5 and leak_auc_bound(4.0) == 1.0
    assert leak_auc_bound(10.0) == 1.0
    # 1/2 + TV − TV²/2 with TV = √ε/2 (Pinsker on the smaller of the two KLs)
    for kl in (0.01, 0.25, 1.0, 3.9):
        tv = math.sqrt(kl) / 2
        assert leak_auc_bound(kl) == pytest.approx(0.5 + tv - tv * tv / 2)
    values = [leak_auc_bound(k) for k in np.linspace(0, 4, 50)]
    assert all(a <= b for a, b in itertools.pairwise(values))


def test_marvell_noise_has_the_solved_covariance() -> None:
    n, d = 60_000, 3
    y = torch.zeros(n)
    y[: n // 4] = 1
    diff = torch.tensor([3.0, 4.0, 0.0], dtype=torch.float64)
    sol = solve_marvell(0.05, 0.5, d, 25.0, 0.25, 2 * 25.0)
    assert sol.lam20 > 0  # the negatives (smaller variance) get perpendicular noise
    out = marvell_noise(torch.zeros(n, d, dtype=torch.float64), y, sol, diff,
                        generator=torch.Generator().manual_seed(0))
    unit = (diff / diff.norm())[:, None]
    for cls, along, spread in ((1, sol.lam11, sol.lam21), (0, sol.lam10, sol.lam20)):
        rows = out[y == cls]
        cov = rows.T @ rows / len(rows)
        expected = (along - spread) * unit @ unit.T + spread * torch.eye(d, dtype=torch.float64)
        torch.testing.assert_close(cov, expected, atol=0.03 * max(along, 1.0), rtol=0.0)


def test_batch_statistics() -> None:
    g = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    stats = batch_statistics(g, torch.tensor([1, 1, 0, 0]))
    assert stats is not None
    assert stats.p == 0.5 and stats.d == 2
    torch.testing.assert_close(stats.difference, torch.tensor([2.0, -2.0], dtype=torch.float64))
    assert stats.g == pytest.approx(8.0) and stats.u == pytest.approx(0.5)
    assert batch_statistics(g, torch.ones(4)) is None  # one class: nothing to model


def test_max_norm_gives_every_row_the_largest_expected_norm() -> None:
    g = torch.tensor([[3.0, 4.0], [0.3, 0.4], [1.0, 0.0]], dtype=torch.float64)
    draws = torch.stack([max_norm_noise(g, generator=torch.Generator().manual_seed(i))
                         for i in range(20_000)])
    mean_sq = (draws ** 2).sum(dim=2).mean(dim=0)
    torch.testing.assert_close(mean_sq, torch.full((3,), 25.0, dtype=torch.float64),
                               rtol=0.05, atol=0.0)
    torch.testing.assert_close(draws[:, 0], g[0].expand(20_000, 2))  # the largest: unchanged
    # the direction is kept up to sign: a scaled copy of each row
    cross = draws[:, 1, 0] * g[1, 1] - draws[:, 1, 1] * g[1, 0]
    assert float(cross.abs().max()) < 1e-9
