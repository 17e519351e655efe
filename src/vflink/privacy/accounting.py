"""Noise calibration and run-level accounting for DP embeddings (pure functions).

Calibration (one release of one record's embedding, VFL-AFE §3.1): the released embedding is
``clip(h) + N(0, (σ·Δ̃)²)`` with Δ̃ = 2t (Eq. 2), so σ is the *noise multiplier* (noise standard
deviation over sensitivity).

* ε < 1: Lemma 3.3 (Dwork & Roth, Thm A.1), σ = c/ε with c² > 2 ln(1.25/δ); we take c just
  above the bound. The lemma does not hold for ε ≥ 1.
* ε ≥ 1: the analytic Gaussian mechanism (Balle & Wang 2018, Thm 8), the smallest σ that gives
  (ε, δ) exactly, from ``dp_accounting.gaussian_mechanism.get_sigma_gaussian``.

Accounting beyond the paper: a run releases a record's embedding many times (once per epoch and
once per evaluation; under soft linkage once per batch in which one of its links appears). Each
release is a Gaussian mechanism with multiplier σ on that record, so the record's loss over m
releases is the m-fold composition. We compose with Google's ``dp_accounting`` **PLD**
accountant: for Gaussian mechanisms it is tight (m-fold composition equals one Gaussian of
multiplier σ/√m, which the tests use as the oracle), whereas the RDP accountant's conversion
to (ε, δ) overestimates ε by 10-30 % at these m. Opacus is not a dependency; dp-accounting is.

Budget first (docs/how-to/privacy.md): a user states the total (ε, δ) of the run;
:func:`planned_releases` bounds how often each record can be released by the announced plan
(epochs, batches, evaluation passes, the record's links), and :func:`calibrate_total` finds
the smallest σ whose composition over the worst-case record's planned releases (on top of
what earlier runs already released) is at most ε at δ under the same PLD accountant the
budget check uses.

Subsampling amplification is *not* claimed: in split learning the primary chooses every batch
and receives each embedding with its row index, so whether a record took part in a step is
known to the very party the guarantee is about; a Poisson-sampled event
(``dp_accounting.PoissonSampledDpEvent``) would only describe an observer who does not see the
batch composition, which the embedding's receiver always does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import dp_accounting
import numpy as np
import numpy.typing as npt
from dp_accounting import gaussian_mechanism
from dp_accounting.pld import PLDAccountant, privacy_loss_distribution
from scipy.stats import norm

from vflink.privacy.randomized_response import noise_parameter

__all__ = [
    "ACCOUNTANT",
    "Calibration",
    "calibrate",
    "calibrate_total",
    "composed_epsilon",
    "composed_epsilon_mixed",
    "composed_epsilon_with_responses",
    "delta_prime",
    "lemma_3_3_sigma",
    "max_releases_within",
    "max_responses_within",
    "planned_releases",
    "rescale_p2",
    "rescale_sigmas_for",
]

#: How the ledger names the accountant.
ACCOUNTANT = "dp-accounting PLD (Gaussian, tight composition)"

# Pessimistic discretisation of the privacy-loss distribution: 1e-3 keeps ε within ~1e-6 of
# the exact value at these sizes and is ~10x faster than the default 1e-4 (measured).
_PLD_INTERVAL = 1e-3


@dataclass(frozen=True)
class Calibration:
    """σ (noise multiplier) for one release at (ε, δ), and which result gave it."""

    sigma: float
    method: str  # "lemma-3.3" or "analytic-gaussian"
    epsilon: float
    delta: float


def lemma_3_3_sigma(epsilon: float, delta: float) -> float:
    """Lemma 3.3: σ ≥ c/ε with c² > 2 ln(1.25/δ), valid for ε ∈ (0, 1)."""
    c = math.sqrt(2.0 * math.log(1.25 / delta))
    return math.nextafter(c, math.inf) / epsilon  # strictly above the bound, as the lemma asks


def calibrate(epsilon: float, delta: float) -> Calibration:
    """σ for one release (Lemma 3.3 when ε < 1, the analytic Gaussian mechanism otherwise)."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need ε > 0 and 0 < δ < 1, got ε = {epsilon}, δ = {delta}")
    if epsilon < 1.0:
        return Calibration(lemma_3_3_sigma(epsilon, delta), "lemma-3.3", epsilon, delta)
    sigma = float(gaussian_mechanism.get_sigma_gaussian(epsilon, delta))
    return Calibration(sigma, "analytic-gaussian", epsilon, delta)


@functools.lru_cache(maxsize=4096)
def composed_epsilon(sigma: float, releases: int, delta: float) -> float:
    """ε at ``delta`` of ``releases`` Gaussian releases of multiplier ``sigma`` (PLD)."""
    if releases <= 0:
        return 0.0
    accountant = PLDAccountant(value_discretization_interval=_PLD_INTERVAL)
    accountant.compose(dp_accounting.GaussianDpEvent(sigma), int(releases))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=4096)
def composed_epsilon_mixed(releases: tuple[tuple[float, int], ...], delta: float) -> float:
    """ε at ``delta`` of a record's releases under several noise settings.

    ``releases`` holds ``(sigma, count)`` pairs: ``count`` Gaussian releases of multiplier
    ``sigma`` each (a secondary whose settings changed between runs). The PLD accountant
    composes every one of them, so the figure is as tight as :func:`composed_epsilon`, which it
    equals (same accountant, same figures) when only one setting was used.
    """
    used = tuple((float(s), int(m)) for s, m in releases if m > 0)
    if not used:
        return 0.0
    if len({s for s, _ in used}) == 1:
        return composed_epsilon(used[0][0], sum(m for _, m in used), delta)
    accountant = PLDAccountant(value_discretization_interval=_PLD_INTERVAL)
    for sigma, m in used:
        accountant.compose(dp_accounting.GaussianDpEvent(sigma), m)
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=4096)
def composed_epsilon_with_responses(gaussian: tuple[tuple[float, int], ...],
                                    responses: tuple[tuple[tuple[int, float], int], ...],
                                    delta: float) -> float:
    """ε at ``delta`` of a record's Gaussian releases (``(sigma, count)`` pairs) together with
    its randomized-response releases (``((k, epsilon), count)`` pairs, each pure ε-DP;
    :mod:`vflink.privacy.randomized_response`).

    Two sound upper bounds, the smaller reported: the PLD accountant's composition of every
    release (dp-accounting's ``from_randomized_response`` and ``from_gaussian_mechanism``
    privacy-loss distributions, composed), and basic composition (the Gaussian part's ε at
    ``delta`` plus Σ count·ε of the responses; exact for a single response, where the PLD's
    pessimistic discretisation may add up to its interval). dp-accounting 0.6's
    ``PLDAccountant`` composes a ``RandomizedResponseDpEvent`` once whatever its count, so the
    distributions are composed here, one per release.

    The Gaussian distribution is the add-or-remove one of sensitivity 1 (σ is the multiplier
    over the replace-one sensitivity 2t, as everywhere in this module), which is symmetric and
    equals the replace-one pair of this mechanism; randomized response's is replace-one.
    """
    used_g = tuple((float(s), int(m)) for s, m in gaussian if m > 0)
    used_r = tuple(((int(k), float(e)), int(m)) for (k, e), m in responses if m > 0)
    if not used_r:
        return composed_epsilon_mixed(used_g, delta)
    basic = composed_epsilon_mixed(used_g, delta) + sum(e * m for (_, e), m in used_r)
    pld = None
    for (k, e), m in used_r:
        if k < 2:
            continue
        one = privacy_loss_distribution.from_randomized_response(
            noise_parameter=noise_parameter(e, k), num_buckets=k,
            value_discretization_interval=_PLD_INTERVAL,
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        part = one.self_compose(m) if m > 1 else one
        pld = part if pld is None else pld.compose(part)
    for sigma, m in used_g:
        g = privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=sigma / math.sqrt(m), value_discretization_interval=_PLD_INTERVAL)
        pld = g if pld is None else pld.compose(g)
    if pld is None:
        return basic
    return float(min(basic, pld.get_epsilon_for_delta(delta)))


def max_responses_within(k: int, epsilon: float, delta: float, budget: float, *,
                         cap: int = 64) -> int:
    """The largest m with m randomized-response releases at ``epsilon`` within ``budget``."""
    m = 0
    while m < cap and composed_epsilon_with_responses((), (((k, epsilon), m + 1),),
                                                      delta) <= budget:
        m += 1
    return m


def max_releases_within(sigma: float, delta: float, budget: float, *, cap: int = 10**6) -> int:
    """The largest m with ``composed_epsilon(sigma, m, delta) <= budget`` (0 if none).

    The m-fold Gaussian composition is one Gaussian of multiplier σ/√m (exact), which finds the
    candidate quickly; the PLD accountant then decides the boundary, so the budget is enforced
    by the same figures the ledger reports.
    """

    def closed(m: int) -> float:
        return float(gaussian_mechanism.get_epsilon_gaussian(sigma / math.sqrt(m), delta))

    lo, hi = 0, 1
    while hi < cap and closed(hi) <= budget:
        lo, hi = hi, hi * 2
    hi = min(hi, cap)
    while hi - lo > 1:  # closed(lo) <= budget < closed(hi)
        mid = (lo + hi) // 2
        if closed(mid) <= budget:
            lo = mid
        else:
            hi = mid
    m = lo
    while m > 0 and composed_epsilon(sigma, m, delta) > budget:
        m -= 1
    while m < cap and composed_epsilon(sigma, m + 1, delta) <= budget:
        m += 1
    return m


def planned_releases(links: npt.NDArray[np.int64], in_train: npt.NDArray[np.bool_], *,
                     epochs: int, train_batches: int, chunks: tuple[int, int, int],
                     extra: int = 0) -> npt.NDArray[np.int64]:
    """The most releases each record can have in a run of the announced plan.

    A record is released at most once per batch (the secondary runs its model once per unique
    row) and once per batch of a pass in which one of its ``links`` primary records appears.
    Per epoch the training pass (``train_batches`` batches) and one validation pass; after
    training one pass over each of train, validation and test (``chunks`` = their numbers of
    evaluation batches); ``extra`` further releases (predictions, attack evaluations).
    ``in_train``: whether one of the record's links is a training record (the secondary knows
    it from ``FitPreprocessing``); the other links may be validation or test records, split in
    the worst way.
    """
    links = np.asarray(links, dtype=np.int64)
    in_train = np.asarray(in_train, dtype=bool)
    c_train, c_val, c_test = chunks
    out = np.zeros(links.shape, dtype=np.int64)
    for n_links, train in {(int(n), bool(t)) for n, t in zip(links, in_train)}:
        n_train = n_links if train else 0  # at most every link a training record
        others = n_links - (1 if train else 0)  # links that may be validation or test records
        m = 0
        if train:
            m += epochs * min(n_train, train_batches) + min(n_train, c_train)
        best_eval = 0
        for a in range(0, others + 1):  # a validation links, the rest test links
            b = others - a
            best_eval = max(best_eval, (epochs + 1) * min(a, c_val) + min(b, c_test))
        m += best_eval
        out[(links == n_links) & (in_train == train)] = m + (extra if n_links else 0)
    return out


def calibrate_total(epsilon: float, delta: float, planned: npt.NDArray[np.int64],
                    history_loss: npt.NDArray[np.float64] | None = None,
                    histories: Callable[[int], tuple[tuple[float, int], ...]] | None = None,
                    *, rtol: float = 1e-4) -> float:
    """The smallest noise multiplier σ (to ``rtol``) whose releases keep every record within
    (``epsilon``, ``delta``): record r, released ``planned[r]`` more times at σ on top of its
    earlier releases, composes (PLD) to at most ``epsilon``.

    ``history_loss[r]`` = Σ_k c_k/σ_k² of record r's earlier releases and ``histories(r)``
    their ``(σ_k, c_k)`` pairs (``None``: no earlier releases). The composition of Gaussians is
    one Gaussian of multiplier (Σ c/σ²)^(-1/2), so for each planned count the record with the
    largest earlier loss is the worst; only those are composed.
    """
    planned = np.asarray(planned, dtype=np.int64)
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need ε > 0 and 0 < δ < 1, got ε = {epsilon}, δ = {delta}")
    loss = (np.zeros(planned.shape) if history_loss is None
            else np.asarray(history_loss, dtype=np.float64))
    candidates: list[tuple[tuple[tuple[float, int], ...], int]] = []
    for m in np.unique(planned):
        if m <= 0:
            continue
        rows = np.flatnonzero(planned == m)
        r = int(rows[int(np.argmax(loss[rows]))])
        past = histories(r) if histories is not None and loss[r] > 0 else ()
        candidates.append((past, int(m)))
    if not candidates:
        return float(gaussian_mechanism.get_sigma_gaussian(epsilon, delta))

    def worst(sigma: float) -> float:
        eps = 0.0
        for past, m in candidates:
            if past:
                merged = dict(past)
                merged[sigma] = merged.get(sigma, 0) + m
                eps = max(eps, composed_epsilon_mixed(tuple(sorted(merged.items())), delta))
            else:
                eps = max(eps, composed_epsilon(sigma, m, delta))
        return eps

    if any(past and composed_epsilon_mixed(past, delta) >= epsilon for past, _ in candidates):
        raise ValueError(f"earlier releases already spend ε ≥ {epsilon:g} at δ = {delta:g}")
    # m-fold composition of multiplier σ is one Gaussian of multiplier σ/√m (exact): the
    # record with no history and the most releases gives the starting point
    m_max = max(m for _, m in candidates)
    lo = float(gaussian_mechanism.get_sigma_gaussian(epsilon, delta)) * math.sqrt(m_max)
    lo *= 0.999
    hi = lo
    while worst(hi) > epsilon:
        lo, hi = hi, hi * 1.05
    if hi == lo:  # already within at the closed form's σ: search downwards
        lo = hi / 1.05
        while worst(lo) <= epsilon:
            hi, lo = lo, lo / 1.05
    while hi / lo - 1.0 > rtol:  # worst(lo) > ε ≥ worst(hi)
        mid = math.sqrt(lo * hi)
        if worst(mid) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


def rescale_p2(sigmas: float) -> float:
    """p2 of Eq. 5: the probability that a pairwise distance stays below μh + k·σh (Φ(k))."""
    return float(norm.cdf(sigmas))


def delta_prime(delta: float, p1: float, p2: float) -> float:
    """δ' = δ / (p1 p2) of Theorem 3.6 (rescaling's estimate may fail with 1 − p1 p2)."""
    return delta / (p1 * p2)


def rescale_sigmas_for(failure: float, releases: int) -> float:
    """k of Eq. 5 such that ``releases`` estimates all hold but with probability ``failure``
    (union bound: releases · (1 − Φ(k)) = failure)."""
    return float(norm.ppf(1.0 - failure / max(int(releases), 1)))
