"""The Fellegi–Sunter model, trained without labels (Fellegi & Sunter, JASA 1969; Winkler 1988).

For a candidate pair with comparison levels γ = (γ_1 … γ_F) (:mod:`.comparison`), fields are
taken as independent given the match status:

    m_f(l) = P(γ_f = l | match),   u_f(l) = P(γ_f = l | non-match),   λ = P(match),

and the pair's match weight and probability are

    w = log2(λ / (1 − λ)) + Σ_f log2(m_f(γ_f) / u_f(γ_f)),     p = 2^w / (1 + 2^w),

a missing field (level −1) adding nothing. Training, as Splink does (and Winkler's EM):

* **u from random pairs.** Two records drawn at random almost never match, so the level
  frequencies of random pairs estimate u (:func:`estimate_u`, add-one smoothing so that a level
  never seen among random pairs gets a finite weight).
* **m and λ by EM over the blocked candidates** (:func:`fit_em`), with u fixed: E-step, each
  pair's posterior p; M-step, λ = mean p and m_f(l) = Σ p·[γ_f = l] / Σ p·[γ_f present]. EM runs
  on the distinct level patterns with their counts (at most Π L_f of them), not on every pair:
  the same fixed point as the per-pair loop of :func:`fit_em_reference`, in time independent of
  the number of pairs.
* **Initialisation that does not collapse**: m starts from a ramp that puts most weight on
  ``exact`` and λ from the share of candidates that a one-to-one linkage could match
  (min(n_P, n_S) / pairs), so EM starts on the matches' side of the likelihood and does not
  slide to the trivial solution m = u.

**Term-frequency adjustment** (Winkler 1989; Splink's ``tf_adjustment``): agreeing on a rare
surname is stronger evidence than agreeing on "smith". With tf(v) = (n_P(v) + n_S(v)) /
(n_P + n_S) the frequency of the agreeing value among both tables' records, which the
coordinator counts from equal keyed hashes without reading a value (:func:`term_frequencies`),
two random records agree on v with probability tf(v)², on any value with u⁰ = Σ_v tf(v)² (the
random pairs' u of ``exact``), and a matching pair shows v with probability tf(v); so among
exact agreements, v multiplies the odds of a match by u⁰ / tf(v). The adjustment
``log2(u⁰_f(exact) / tf(v))`` is added to the exact level's weight after EM (u⁰ from random
pairs even when EM re-estimated u among the candidates).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError, LinkageError

__all__ = ["FSModel", "estimate_u", "fit_em", "fit_em_reference", "initial_m",
           "match_probability", "match_weights", "term_frequencies"]

FloatArray = npt.NDArray[np.float64]
Int8Array = npt.NDArray[np.int8]
#: The smallest m or u a level may take: keeps every weight finite.
_FLOOR = 1e-12
#: Pseudo-pairs of the priors of the M-step (see :func:`fit_em`): u's prior is the random
#: pairs' u, m's the initial ramp.
U_PRIOR_PAIRS = 100.0
M_PRIOR_PAIRS = 10.0


@dataclass(frozen=True, eq=False)
class FSModel:
    """A trained model: per field the m and u probabilities of its levels (``0`` = else …
    ``L−1`` = exact), the prior λ among candidates, and how EM ended."""

    names: tuple[str, ...]
    levels: tuple[tuple[str, ...], ...]
    m: tuple[FloatArray, ...]
    u: tuple[FloatArray, ...]
    lam: float
    iterations: int = 0
    converged: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def prior_weight(self) -> float:
        """log2(λ / (1 − λ)): the weight of a pair before any field is compared."""
        lam = min(max(self.lam, _FLOOR), 1.0 - 1e-15)
        return math.log2(lam / (1.0 - lam))

    def level_weights(self) -> tuple[FloatArray, ...]:
        """log2(m / u) of every level of every field (the Bayes factors, in bits)."""
        return tuple(np.log2(np.maximum(m, _FLOOR) / np.maximum(u, _FLOOR))
                     for m, u in zip(self.m, self.u, strict=True))

    def table(self) -> list[dict[str, Any]]:
        """The m/u table: one row per field and level, with its weight in bits."""
        rows = []
        for f, name in enumerate(self.names):
            weights = self.level_weights()[f]
            for level in reversed(range(len(self.levels[f]))):
                rows.append({"field": name, "level": self.levels[f][level],
                             "m": float(self.m[f][level]), "u": float(self.u[f][level]),
                             "weight": float(weights[level])})
        return rows


def initial_m(n_levels: Sequence[int]) -> tuple[FloatArray, ...]:
    """EM's starting m: level l of L gets a share ∝ 4^l (``exact`` ≈ 3/4 of the mass)."""
    out = []
    for n in n_levels:
        ramp = 4.0 ** np.arange(n, dtype=np.float64)
        out.append(ramp / ramp.sum())
    return tuple(out)


def estimate_u(levels: Int8Array, n_levels: Sequence[int], *, smoothing: float = 1.0
               ) -> tuple[FloatArray, ...]:
    """u of every field from the levels of random pairs: each level's share among the pairs
    where the field is present, with ``smoothing`` pseudo-pairs per level (add-one)."""
    levels = np.asarray(levels)
    if levels.ndim != 2 or levels.shape[1] != len(n_levels):
        raise LinkageError(f"levels must be (pairs, {len(n_levels)}), got {levels.shape}")
    out = []
    for f, n in enumerate(n_levels):
        col = levels[:, f]
        counts = np.bincount(col[col >= 0].astype(np.int64), minlength=n)[:n].astype(float)
        counts += smoothing
        out.append(counts / counts.sum())
    return tuple(out)


def _patterns(levels: Int8Array) -> tuple[npt.NDArray[np.int8], FloatArray,
                                          npt.NDArray[np.int64]]:
    """The distinct rows of ``levels``, their counts, and each pair's pattern number."""
    levels = np.asarray(levels, dtype=np.int8)
    if levels.shape[0] == 0:
        return levels, np.zeros(0), np.zeros(0, dtype=np.int64)
    base = int(levels.max()) + 2
    code = np.zeros(levels.shape[0], dtype=np.int64)
    for f in range(levels.shape[1]):
        code = code * base + (levels[:, f].astype(np.int64) + 1)
    uniq, first, inverse, counts = np.unique(code, return_index=True, return_inverse=True,
                                             return_counts=True)
    del uniq
    return levels[first], counts.astype(np.float64), inverse.astype(np.int64)


def _log_factors(patterns: npt.NDArray[np.int8], probs: Sequence[FloatArray]) -> FloatArray:
    """Σ_f log(prob_f(level)) per pattern, missing fields adding 0."""
    out = np.zeros(len(patterns))
    for f, p in enumerate(probs):
        col = patterns[:, f].astype(np.int64)
        present = col >= 0
        out[present] += np.log(np.maximum(p[col[present]], _FLOOR))
    return out


def fit_em(levels: Int8Array, n_levels: Sequence[int], u: Sequence[FloatArray], *,
           names: Sequence[str] = (), level_names: Sequence[Sequence[str]] = (),
           lam: float | None = None, m: Sequence[FloatArray] | None = None,
           expected_matches: float | None = None, max_iter: int = 200,
           tol: float = 1e-7, fix_u: bool = False, prior_u: float = U_PRIOR_PAIRS,
           prior_m: float = M_PRIOR_PAIRS, total_pairs: float | None = None) -> FSModel:
    """m and λ by EM over the candidate pairs' ``levels`` with u fixed (module docstring).

    λ starts at ``lam``, else at ``expected_matches`` / pairs (clipped to [1e-4, 0.5]), else
    0.1; m at ``m``, else :func:`initial_m`. Stops when no m or λ moves by more than ``tol``.
    Unless ``fix_u``, u is re-estimated too, among the candidates' non-matches (module
    docstring), each M-step adding ``prior_u`` pseudo-pairs distributed as the given ``u``
    and ``prior_m`` pseudo-pairs distributed as :func:`initial_m` (MAP estimates under
    Dirichlet priors): a level seen in few candidates then keeps a finite, moderate weight.

    ``total_pairs``: the candidates were drawn from this many pairs (all pairs of the two
    tables, n_P·n_S), and every pair outside them counts as a non-match: λ is then the prior
    over all pairs, λ = Σ_candidates p / total_pairs (EM over all pairs, the pairs that
    blocking left out having posterior 0), and its starting value ``expected_matches`` /
    total_pairs.
    """
    n_fields = len(n_levels)
    levels = np.asarray(levels, dtype=np.int8)
    if levels.ndim != 2 or levels.shape[1] != n_fields:
        raise LinkageError(f"levels must be (pairs, {n_fields}), got {levels.shape}")
    if len(levels) == 0:
        raise LinkageError("the Fellegi–Sunter model needs at least one candidate pair")
    patterns, counts, _ = _patterns(levels)
    total = counts.sum() if total_pairs is None else float(total_pairs)
    if total < counts.sum():
        raise LinkageError(f"total_pairs = {total_pairs} is below the {int(counts.sum())} "
                           "candidate pairs")
    if lam is None:
        lam = 0.1 if expected_matches is None else float(
            np.clip(expected_matches / total, min(1e-4, 0.5 / total), 0.5))
    m_cur = [np.asarray(x, dtype=np.float64).copy() for x in (m or initial_m(n_levels))]
    u_arr = [np.asarray(x, dtype=np.float64) for x in u]
    u_prior = [prior_u * x for x in u_arr]
    m_prior = [prior_m * x for x in initial_m(n_levels)]
    log_u = _log_factors(patterns, u_arr)
    present = [patterns[:, f] >= 0 for f in range(n_fields)]
    converged = False
    iteration = 0
    while iteration < max_iter:
        iteration += 1
        log_m = _log_factors(patterns, m_cur)
        # posterior of each pattern, from the log-odds (no overflow for any weight)
        log_odds = math.log(lam) - math.log1p(-lam) + log_m - log_u
        post = 0.5 * (1.0 + np.tanh(0.5 * log_odds))
        weighted = counts * post
        new_lam = float(weighted.sum() / total)
        new_m = _m_step(patterns, weighted, present, n_levels, m_prior)
        change = max([abs(new_lam - lam)]
                     + [float(np.abs(a - b).max()) for a, b in zip(new_m, m_cur, strict=True)])
        if not fix_u:
            new_u = _m_step(patterns, counts - weighted, present, n_levels, u_prior)
            change = max([change] + [float(np.abs(a - b).max())
                                     for a, b in zip(new_u, u_arr, strict=True)])
            u_arr = new_u
            log_u = _log_factors(patterns, u_arr)
        lam = min(max(new_lam, _FLOOR), 1.0 - 1e-12)
        m_cur = new_m
        if change < tol:
            converged = True
            break
    return FSModel(names=tuple(names) or tuple(f"field{f}" for f in range(n_fields)),
                   levels=tuple(tuple(x) for x in level_names) or tuple(
                       tuple(str(i) for i in range(n)) for n in n_levels),
                   m=tuple(m_cur), u=tuple(u_arr), lam=float(lam), iterations=iteration,
                   converged=converged,
                   extra={"u_random": tuple(np.asarray(x, dtype=np.float64) for x in u)})


def _m_step(patterns: npt.NDArray[np.int8], weighted: FloatArray,
            present: Sequence[npt.NDArray[np.bool_]], n_levels: Sequence[int],
            prior: Sequence[FloatArray]) -> list[FloatArray]:
    """Each field's level shares of ``weighted`` pattern counts where the field is present,
    plus the ``prior`` pseudo-counts of each level."""
    out = []
    for f, n in enumerate(n_levels):
        col = patterns[:, f].astype(np.int64)
        mass = np.asarray(np.bincount(col[present[f]], weights=weighted[present[f]],
                                      minlength=n)[:n], dtype=np.float64) + prior[f]
        s = mass.sum()
        out.append(np.maximum(mass / s, _FLOOR) if s > 0 else np.full(n, 1.0 / n))
    return out


def fit_em_reference(levels: Int8Array, n_levels: Sequence[int], u: Sequence[FloatArray], *,
                     lam: float, m: Sequence[FloatArray], iterations: int,
                     fix_u: bool = False, prior_u: float = U_PRIOR_PAIRS,
                     prior_m: float = M_PRIOR_PAIRS) -> FSModel:
    """Plain reference of :func:`fit_em`: the same EM, pair by pair, in Python floats, for a
    fixed number of iterations (tests compare the two)."""
    rows = np.asarray(levels).tolist()
    ramp = [list(map(float, x)) for x in initial_m(n_levels)]
    u_given = [list(map(float, x)) for x in u]
    m_cur = [list(map(float, x)) for x in m]
    u_cur = [list(x) for x in u_given]

    def shares(weights: list[float], f: int, prior: list[float]) -> list[float]:
        mass = list(prior)
        for row, p in zip(rows, weights, strict=True):
            if row[f] >= 0:
                mass[row[f]] += p
        total = sum(mass)
        return [max(x / total, _FLOOR) for x in mass]

    for _ in range(iterations):
        posts = []
        for row in rows:
            pm, pu = lam, 1.0 - lam
            for f, level in enumerate(row):
                if level >= 0:
                    pm *= m_cur[f][level]
                    pu *= u_cur[f][level]
            posts.append(pm / (pm + pu))
        lam = sum(posts) / len(posts)
        m_cur = [shares(posts, f, [prior_m * x for x in ramp[f]]) for f in range(len(n_levels))]
        if not fix_u:
            u_cur = [shares([1.0 - p for p in posts], f, [prior_u * x for x in u_given[f]])
                     for f in range(len(n_levels))]
    return FSModel(names=tuple(f"field{f}" for f in range(len(n_levels))),
                   levels=tuple(tuple(str(i) for i in range(n)) for n in n_levels),
                   m=tuple(np.asarray(x) for x in m_cur),
                   u=tuple(np.asarray(x, dtype=float) for x in u_cur), lam=lam,
                   iterations=iterations)


def term_frequencies(codes_p: npt.NDArray[np.int64], codes_s: npt.NDArray[np.int64]
                     ) -> tuple[FloatArray, FloatArray]:
    """tf(v) = (n_P(v) + n_S(v)) / (n_P + n_S) of each record's value on each side, from
    value codes (equal codes = equal keyed hashes; a negative code is a missing value, tf 0).
    """
    both = np.concatenate([codes_p, codes_s])
    present = both >= 0
    if not present.any():
        return np.zeros(len(codes_p)), np.zeros(len(codes_s))
    _, inverse, counts = np.unique(both[present], return_inverse=True, return_counts=True)
    tf = np.zeros(len(both))
    tf[present] = counts[inverse] / float(present.sum())
    return tf[:len(codes_p)], tf[len(codes_p):]


def match_weights(model: FSModel, levels: Int8Array, *,
                  tf: Sequence[FloatArray | None] = ()) -> tuple[FloatArray, FloatArray]:
    """Each pair's match weight and each field's contribution to it (``(pairs, fields)``).

    ``tf[f]`` (optional, per pair): the frequency of the agreeing value where field f agrees
    exactly; log2(u⁰/tf) is added to the exact level's log2(m/u) there (module docstring; u⁰
    is ``model.extra["u_random"]``, else the model's u).
    """
    levels = np.asarray(levels, dtype=np.int8)
    if levels.ndim != 2 or levels.shape[1] != len(model.m):
        raise ConfigError(f"levels must be (pairs, {len(model.m)}), got {levels.shape}")
    weights = model.level_weights()
    contrib = np.zeros(levels.shape, dtype=np.float64)
    for f, w in enumerate(weights):
        col = levels[:, f].astype(np.int64)
        present = col >= 0
        contrib[present, f] = w[col[present]]
        freq = tf[f] if f < len(tf) else None
        if freq is not None:
            top = len(w) - 1
            at = (col == top) & (np.asarray(freq) > 0)
            base = model.extra.get("u_random", model.u)[f][top]
            contrib[at, f] += np.log2(np.maximum(base, _FLOOR)
                                      / np.maximum(np.asarray(freq)[at], _FLOOR))
    return model.prior_weight + contrib.sum(axis=1), contrib


def match_probability(weights: npt.ArrayLike) -> FloatArray:
    """p = 2^w / (1 + 2^w), computed without overflow."""
    w = np.asarray(weights, dtype=np.float64)
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * math.log(2.0) * w)), dtype=np.float64)
