"""Marvell and max-norm: perturbations of a batch's gradient rows against label leakage
(Li, Sun, Yang et al., "Label Leakage and Protection in Two-party Split Learning", ICLR 2022).

**Marvell** (§4). Model the rows of one batch as two Gaussians: positives (fraction p) around
ḡ₁ with per-coordinate variance v, negatives around ḡ₀ with variance u, in d dimensions.
Add N(0, Σ₁) to every positive row and N(0, Σ₀) to every negative one, with covariances of the
form Σ_c = (λ₁c − λ₂c)·Δ̂Δ̂ᵀ + λ₂c·I along Δ̂ = (ḡ₁ − ḡ₀)/‖ḡ₁ − ḡ₀‖ and the rest, chosen to
minimise the sum of the two KL divergences between the perturbed class distributions,

    sumKL = ½ [ (λ₁₀+u+g)/(λ₁₁+v) + (λ₁₁+v+g)/(λ₁₀+u)
                + (d−1)((λ₂₀+u)/(λ₂₁+v) + (λ₂₁+v)/(λ₂₀+u)) ] − d,     g = ‖ḡ₁ − ḡ₀‖²,

under the noise power budget p·(λ₁₁ + (d−1)λ₂₁) + (1−p)·(λ₁₀ + (d−1)λ₂₀) ≤ P, P = s·g, with
0 ≤ λ₂c ≤ λ₁c (so each Σ_c is a covariance). Any detector of the label from one perturbed row
then has AUC ≤ 1/2 + √sumKL/2 − sumKL/8 when sumKL < 4 (Pinsker: the total variation is at most
√sumKL/2, and an AUC is at most 1/2 + TV − TV²/2); :func:`leak_auc_bound`. The perpendicular
term is smallest when both classes have the same variance there, so only the class with the
smaller variance gets perpendicular noise (the authors' solver fixes the other one at 0 too).

:func:`solve_marvell` reduces it to one scalar search: for a fixed perpendicular noise the
power left along Δ̂ is split in closed form (the u = v = 0 case, :func:`zero_variance_solution`,
is that closed form alone); tests check it against a brute-force grid over all four variables
and SciPy's SLSQP. The problem is scale-free (every term is a ratio), so it is solved on u, v,
P divided by g and scaled back. A hand-written reduction rather than a general solver: it runs
once per batch and secondary, and SLSQP from several starts made a 20-epoch Adult run 14x
slower (147 s against 10 s; this solver: 9 s; one run each on the shared machine).

**max-norm** (the heuristic of the same paper): row i is multiplied by 1 + ξ_i·σ_i, ξ_i ~ N(0, 1),
σ_i = √(max_j‖g_j‖² / ‖g_i‖² − 1), so every row's expected squared norm is the batch's largest;
it hides the norm attack's signal and carries no formal guarantee.

Pure functions; the stateful wrapper is :class:`vflink.privacy.label_protection.LabelProtection`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize_scalar

__all__ = ["MarvellSolution", "MarvellStatistics", "batch_statistics", "leak_auc_bound",
           "marvell_noise", "max_norm_noise", "solve_marvell", "sum_kl",
           "zero_variance_solution"]


@dataclass(frozen=True)
class MarvellStatistics:
    """One batch's two-Gaussian model: u, v (mean per-coordinate variance of the negative and
    the positive rows), d, g = ‖ḡ₁ − ḡ₀‖², p (fraction of positives), and ḡ₁ − ḡ₀."""

    u: float
    v: float
    d: int
    g: float
    p: float
    difference: torch.Tensor


@dataclass(frozen=True)
class MarvellSolution:
    """λ₁₀, λ₂₀ (negatives: along Δ̂, and every other direction), λ₁₁, λ₂₁ (positives), and the
    resulting sum of KL divergences."""

    lam10: float
    lam20: float
    lam11: float
    lam21: float
    sum_kl: float

    def power(self, p: float, d: int) -> float:
        """The expected squared norm of the noise added to a row."""
        return (p * (self.lam11 + (d - 1) * self.lam21)
                + (1 - p) * (self.lam10 + (d - 1) * self.lam20))

    def scaled(self, factor: float) -> MarvellSolution:
        return MarvellSolution(self.lam10 * factor, self.lam20 * factor, self.lam11 * factor,
                               self.lam21 * factor, self.sum_kl)


def sum_kl(lam10: float, lam20: float, lam11: float, lam21: float, *, u: float, v: float,
           d: int, g: float) -> float:
    """KL(P̃₁‖P̃₀) + KL(P̃₀‖P̃₁) of the perturbed class Gaussians (module docstring); with
    u = v = 0 and no perpendicular noise the rows are one-dimensional, and the
    perpendicular terms drop out."""
    a, b = lam10 + u, lam11 + v
    if a <= 0 or b <= 0:
        return math.inf if g > 0 else 0.0
    parallel = (a + g) / b + (b + g) / a
    a2, b2 = lam20 + u, lam21 + v
    if a2 <= 0 and b2 <= 0:
        return 0.5 * parallel - 1.0
    if a2 <= 0 or b2 <= 0:
        return math.inf
    return 0.5 * (parallel + (d - 1) * (a2 / b2 + b2 / a2)) - d


def leak_auc_bound(kl: float) -> float:
    """The largest AUC any detector of the label can reach from one perturbed row when the sum
    of KL divergences is ``kl``: 1/2 + √kl/2 − kl/8 for kl < 4, else 1 (Li et al., §4)."""
    if not kl > 0:
        return 0.5
    if kl >= 4.0:
        return 1.0
    return 0.5 + math.sqrt(kl) / 2.0 - kl / 8.0


def _parallel(g: float, p: float, total: float, a_low: float, b_low: float
              ) -> tuple[float, float]:
    """The total variances A = λ₁₀ + u, B = λ₁₁ + v along Δ̂ that minimise
    (A + g)/B + (B + g)/A on the line p·B + (1 − p)·A = ``total``, with A ≥ ``a_low`` and
    B ≥ ``b_low``. Along the line both terms are convex in A, so the optimum is the stationary
    point A = total/(p·E + 1 − p), E = √((total + (1 − p)g)/(total + p·g)), clipped to the
    segment."""
    e = math.sqrt((total + (1 - p) * g) / (total + p * g))
    a_high = (total - p * b_low) / (1 - p)
    a = min(max(total / (p * e + 1 - p), a_low), a_high)
    return a, (total - (1 - p) * a) / p


def zero_variance_solution(g: float, p: float, power: float) -> MarvellSolution:
    """The closed form of the u = v = 0 case (each class a point; the rows one-dimensional):
    minimise (a+g)/b + (b+g)/a under p·b + (1−p)·a = P, a = λ₁₀, b = λ₁₁ (the stationary point
    of the Lagrangian, :func:`_parallel`)."""
    if not (0 < p < 1):
        raise ValueError(f"need both classes in the batch, got a positive fraction {p}")
    a, b = _parallel(g, p, power, 0.0, 0.0)
    return MarvellSolution(a, 0.0, b, 0.0, sum_kl(a, 0.0, b, 0.0, u=0.0, v=0.0, d=1, g=g))


def solve_marvell(u: float, v: float, d: int, g: float, p: float, power: float
                  ) -> MarvellSolution:
    """The covariances of least sum of KL divergences under the noise power budget ``power``
    (module docstring). ``d = 1`` or u = v = 0 reduce to the one-dimensional problem.

    Only the class of smaller variance gets perpendicular noise c (the perpendicular term is
    least when the two variances there are equal). For a fixed c the rest of the power goes
    along Δ̂ by the closed form of :func:`_parallel`; c itself is found by a bounded scalar
    search on [0, min(|v − u|, the most the power allows)] after a coarse scan of it (the
    objective in c need not be convex)."""
    if not (0 < p < 1):
        raise ValueError(f"need both classes in the batch, got a positive fraction {p}")
    if g <= 0 or power <= 0:
        return MarvellSolution(0.0, 0.0, 0.0, 0.0,
                               sum_kl(0.0, 0.0, 0.0, 0.0, u=u, v=v, d=d, g=g))
    # scale-free: every term of sumKL is a ratio of (λ + u, v, g), and P scales with them
    un, vn, pn = u / g, v / g, power / g
    if (un <= 0 and vn <= 0) or d <= 1:
        a, b = _parallel(1.0, p, pn + p * vn + (1 - p) * un, un, vn)
        lam10, lam11 = a - un, b - vn
        return MarvellSolution(lam10 * g, 0.0, lam11 * g, 0.0,
                               sum_kl(lam10, 0.0, lam11, 0.0, u=un, v=vn, d=d, g=1.0))
    small_neg = un <= vn  # the negatives' perpendicular variance is raised towards v
    weight = (1 - p) if small_neg else p

    def lambdas(c: float) -> tuple[float, float, float, float]:
        rest = pn - weight * (d - 1) * c  # the power left for the direction Δ̂
        total = rest + p * vn + (1 - p) * un
        a, b = _parallel(1.0, p, total, un + (c if small_neg else 0.0),
                         vn + (0.0 if small_neg else c))
        lam10, lam11 = max(a - un, 0.0), max(b - vn, 0.0)
        return (lam10, c, lam11, 0.0) if small_neg else (lam10, 0.0, lam11, c)

    def objective(c: float) -> float:
        lam10, lam20, lam11, lam21 = lambdas(c)
        return sum_kl(lam10, lam20, lam11, lam21, u=un, v=vn, d=d, g=1.0)

    # c ≤ |v − u| (beyond it the perpendicular term grows again) and c ≤ λ₁ of its own class,
    # which the power bounds by P/(weight·d)
    high = min(abs(vn - un), pn / (weight * d))
    grid = np.linspace(0.0, high, 17)
    values = [objective(float(c)) for c in grid]
    i = int(np.argmin(values))
    best_c, best = float(grid[i]), values[i]
    if high > 0:
        lo, hi = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, len(grid) - 1)])
        res = minimize_scalar(objective, bounds=(lo, hi), method="bounded",
                              options={"xatol": 1e-10 * max(high, 1e-300)})
        if res.success and float(res.fun) < best:
            best_c, best = float(res.x), float(res.fun)
    lam10, lam20, lam11, lam21 = lambdas(best_c)
    return MarvellSolution(lam10 * g, lam20 * g, lam11 * g, lam21 * g, best)


def batch_statistics(gradients: torch.Tensor, labels: torch.Tensor) -> MarvellStatistics | None:
    """The two-Gaussian model of one batch (``labels`` 0/1 per row), or ``None`` when the
    batch holds one class only."""
    g = gradients.detach().double().reshape(gradients.shape[0], -1)
    y = labels.detach().reshape(-1) > 0.5
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == len(y):
        return None
    pos, neg = g[y], g[~y]
    mean1, mean0 = pos.mean(dim=0), neg.mean(dim=0)
    v = float(((pos - mean1) ** 2).mean())
    u = float(((neg - mean0) ** 2).mean())
    diff = mean1 - mean0
    return MarvellStatistics(u=u, v=v, d=g.shape[1], g=float(diff @ diff), p=n_pos / len(y),
                             difference=diff)


def marvell_noise(gradients: torch.Tensor, labels: torch.Tensor, solution: MarvellSolution,
                  difference: torch.Tensor, generator: torch.Generator | None = None,
                  normal: torch.Tensor | None = None) -> torch.Tensor:
    """The rows plus Marvell's noise: ξ·√(λ₁c − λ₂c)·Δ̂ + √λ₂c·N(0, I) for class c of each row.

    ``normal``: the standard normal draws to use, shape (n, d + 1) (the secure source's);
    otherwise drawn from ``generator``."""
    g = gradients.detach()
    n = g.shape[0]
    flat = g.reshape(n, -1)
    d = flat.shape[1]
    y = labels.detach().reshape(-1).to(torch.float64) > 0.5
    if normal is None:
        normal = torch.randn((n, d + 1), generator=generator, dtype=torch.float64)
    norm = float(torch.linalg.vector_norm(difference.double()))
    unit = (difference.double() / norm) if norm > 0 else torch.zeros(d, dtype=torch.float64)
    along = torch.where(y, math.sqrt(max(solution.lam11 - solution.lam21, 0.0)),
                        math.sqrt(max(solution.lam10 - solution.lam20, 0.0)))
    spread = torch.where(y, math.sqrt(max(solution.lam21, 0.0)),
                         math.sqrt(max(solution.lam20, 0.0)))
    noise = (normal[:, :1] * along[:, None]) * unit[None, :] + normal[:, 1:] * spread[:, None]
    return (flat.double() + noise).to(g.dtype).reshape(g.shape)


def max_norm_noise(gradients: torch.Tensor, generator: torch.Generator | None = None,
                   normal: torch.Tensor | None = None) -> torch.Tensor:
    """Li et al.'s max-norm heuristic: g_i·(1 + ξ_i·σ_i), σ_i = √(max_j‖g_j‖²/‖g_i‖² − 1)."""
    g = gradients.detach()
    n = g.shape[0]
    flat = g.reshape(n, -1).double()
    if n == 0:
        return g.clone()
    norms2 = (flat ** 2).sum(dim=1)
    top = float(norms2.max())
    ratio = torch.where(norms2 > 0, top / norms2.clamp_min(1e-300), torch.zeros_like(norms2))
    sigma = torch.sqrt((ratio - 1.0).clamp_min(0.0))
    if normal is None:
        normal = torch.randn(n, generator=generator, dtype=torch.float64)
    out = flat * (1.0 + normal.reshape(-1) * sigma)[:, None]
    return out.to(g.dtype).reshape(g.shape)
