"""The Fellegi–Sunter model, trained without labels (Fellegi & Sunter, JASA 1969; Winkler 1988),
under the cardinality of the link: one-to-one between two deduplicated tables (Jaro 1989;
Sadinle 2017), or many-to-one, one-to-many, many-to-many when a table holds duplicates.

For a candidate pair with comparison levels γ = (γ_1 … γ_F) (:mod:`.comparison`), fields are
taken as independent given the match status:

    m_f(l) = P(γ_f = l | match),   u_f(l) = P(γ_f = l | non-match),   λ = P(match),

and the pair's **match weight** (bits) is

    w = log2(λ / (1 − λ)) + Σ_f log2(m_f(γ_f) / u_f(γ_f)),

a missing field (level −1) adding nothing. 2^w / (1 + 2^w) would be the pair's probability if
pairs were independent. They are not: a record of one table has at most one counterpart in the
other, so near-identical candidates of one record compete for it. The **match probability**
is the posterior under that constraint (:func:`one_to_one_posterior`),

    q_ij = o_ij / (1 + Σ_k o_ik + Σ_k o_kj − o_ij),        o_ij = 2^{w_ij},

exact when at most one pair of the row and one of the column compete, and an approximation of
the bipartite-matching posterior otherwise (two equally strong candidates of a record share it
and get q < 1/2 each).

**Cardinality** (:data:`CARDINALITIES`, :func:`posterior`). The constraint is a property of the
link, not of the model: when the primary holds duplicates (several primary records of one
entity, *many-to-one*), a secondary record has several true counterparts and only each primary
record's candidates compete (a primary record has at most one match):

    many-to-one   q_ij = o_ij / (1 + Σ_k o_ik)            (row constraint)
    one-to-many   q_ij = o_ij / (1 + Σ_k o_kj)            (column constraint)
    many-to-many  q_ij = o_ij / (1 + o_ij)                (pairs independent)

the exact posterior of each record's choice among its candidates (Sadinle 2017, §2, with the
bipartite constraint kept on one side only). Under the one-to-one posterior, k near-identical
duplicates of one record share its single match and get q ≈ 1/k each: on FEBRL3's
duplicates linked to their originals that kept 1,137 of 3,000 true pairs (F1 0.55).
:func:`estimate_cardinality` tells the cardinality from the data (records with several
near-certain counterparts), and the EM's E-step and the decisions follow the one in force.

Training, without labels:

* **u from random pairs** (:func:`estimate_u`, add-one smoothing so that a level never seen
  among random pairs keeps a finite weight). Random pairs are almost all non-matches; the few
  matches among them (a share λ) are taken out with the current m (:func:`unmix_u`).
* **m and λ by EM under the one-to-one constraint** (:func:`fit_em`): the E-step gives each
  candidate pair its posterior q (above), the M-step sets m_f(l) = Σ q·[γ_f = l] / Σ q·[γ_f
  present] (plus a few pseudo-pairs of prior) and λ = Σ q / (n_P·n_S). The plain EM of a
  two-class mixture (each pair independently a match or not) finds the largest latent class
  among the pairs, which on real tables is often not the matches: on restaurant guides it is
  "same city" (thousands of pairs), and m(name exact) came out at 0.02. Under the constraint a
  record that agrees with hundreds of candidates on its city spreads its one match over them,
  so only pairs that stand out from their competitors carry the match class.
* **Initialisation**: m from a ramp that puts most weight on ``exact``, λ from the most
  matches a one-to-one link allows (min(n_P, n_S) / (n_P·n_S)).

**Term-frequency adjustment** (Winkler 1989; Splink's ``tf_adjustment``): agreeing on a rare
surname is stronger evidence than agreeing on "smith". With tf(v) = (n_P(v) + n_S(v)) /
(n_P + n_S) the frequency of the agreeing value among both tables' records, which the
coordinator counts from equal keyed hashes without reading a value (:func:`term_frequencies`),
two random records agree on v with probability tf(v)², on any value with u⁰ = Σ_v tf(v)² (the
random pairs' u of ``exact``), and a matching pair shows v with probability tf(v); so among
exact agreements, v multiplies the odds of a match by u⁰ / tf(v). The adjustment
``log2(u⁰_f(exact) / tf(v))`` is added to the exact level's weight after EM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError, LinkageError

__all__ = ["CARDINALITIES", "FSModel", "estimate_cardinality", "estimate_u", "fit_em",
           "fit_em_reference", "initial_m", "match_weights", "near_certain_counts",
           "one_to_one_posterior", "posterior", "prior_matches", "term_frequencies", "unmix_u"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Int8Array = npt.NDArray[np.int8]
#: The smallest m or u a level may take: keeps every weight finite.
_FLOOR = 1e-12
#: Pseudo-pairs of the M-step's prior (see :func:`fit_em`), distributed as the initial ramp.
M_PRIOR_PAIRS = 10.0
#: The cardinalities of a link of the primary to the secondary (module docstring): which
#: records have at most one match. "many-to-one": many primary records to one secondary.
CARDINALITIES = ("one-to-one", "many-to-one", "one-to-many", "many-to-many")
#: Which side's candidates compete for one match under each cardinality: (rows, columns).
_CONSTRAINED = {"one-to-one": (True, True), "many-to-one": (True, False),
                "one-to-many": (False, True), "many-to-many": (False, False)}


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


def unmix_u(u_random: Sequence[FloatArray], lam: float, m: Sequence[FloatArray]
            ) -> list[FloatArray]:
    """u with the matches among random pairs taken out: a random pair is a match with
    probability λ (the prior over all pairs), so the random pairs' level shares are
    (1 − λ)·u + λ·m and u = (shares − λ·m) / (1 − λ), floored at a tenth of the shares and
    renormalised."""
    lam = min(max(float(lam), 0.0), 0.5)
    out = []
    for shares, m_f in zip(u_random, m, strict=True):
        u = np.maximum((shares - lam * m_f) / (1.0 - lam), 0.1 * shares)
        out.append(u / u.sum())
    return out


def one_to_one_posterior(rows: IntArray, cols: IntArray, weights: FloatArray) -> FloatArray:
    """q_ij = o_ij / (1 + Σ_k o_ik + Σ_k o_kj − o_ij), o = 2^w (module docstring), computed
    in a shifted log scale so that no odds overflow."""
    w = np.asarray(weights, dtype=np.float64)
    if not len(w):
        return np.zeros(0)
    # o = 2^w; divide numerator and denominator by 2^c for large weights
    c = max(0.0, float(w.max()))
    o = np.exp2(w - c)
    by_row = np.bincount(rows, weights=o, minlength=int(rows.max()) + 1)
    by_col = np.bincount(cols, weights=o, minlength=int(cols.max()) + 1)
    denom = np.exp2(-c) + by_row[rows] + by_col[cols] - o
    return np.asarray(np.clip(o / np.maximum(denom, np.finfo(float).tiny), 0.0, 1.0))


def _check_cardinality(cardinality: str) -> tuple[bool, bool]:
    if cardinality not in _CONSTRAINED:
        raise ConfigError(f"`cardinality` must be one of {', '.join(CARDINALITIES)}, got "
                          f"{cardinality!r}")
    return _CONSTRAINED[cardinality]


def posterior(rows: IntArray, cols: IntArray, weights: FloatArray,
              cardinality: str = "one-to-one") -> FloatArray:
    """Each pair's match probability under ``cardinality`` (module docstring): the one-to-one
    posterior, the row- or column-constrained one, or the independent o/(1 + o); in a shifted
    log scale so that no odds overflow."""
    by_rows, by_cols = _check_cardinality(cardinality)
    if by_rows and by_cols:
        return one_to_one_posterior(rows, cols, weights)
    w = np.asarray(weights, dtype=np.float64)
    if not len(w):
        return np.zeros(0)
    c = max(0.0, float(w.max()))
    o = np.exp2(w - c)
    denom = np.exp2(-c) + o
    if by_rows:
        denom += np.bincount(rows, weights=o, minlength=int(rows.max()) + 1)[rows] - o
    if by_cols:
        denom += np.bincount(cols, weights=o, minlength=int(cols.max()) + 1)[cols] - o
    return np.asarray(np.clip(o / np.maximum(denom, np.finfo(float).tiny), 0.0, 1.0))


def prior_matches(n_p: int, n_s: int, cardinality: str = "one-to-one") -> float:
    """The most matches a link of ``cardinality`` allows between n_P and n_S records, EM's
    starting λ·n_P·n_S: min(n_P, n_S) one-to-one, n_P many-to-one (each primary record at most
    once), n_S one-to-many, max(n_P, n_S) many-to-many (a start, not a bound)."""
    by_rows, by_cols = _check_cardinality(cardinality)
    if by_rows and by_cols:
        return float(min(n_p, n_s))
    if by_rows:
        return float(n_p)
    return float(n_s) if by_cols else float(max(n_p, n_s))


#: A pair is a *near-certain* counterpart when its match weight alone (pairs taken as
#: independent) gives a probability of at least this.
NEAR_CERTAIN = 0.99
#: Share of the records with a near-certain counterpart that must have several before a side
#: is said to hold duplicates (and at least :data:`DUPLICATES_MIN` records). Distinct look-alike
#: records reach it too: on the Fodor's–Zagat guides, 4.4 % of the records with a near-certain
#: counterpart have several (a hotel's restaurants share an address and a telephone), and
#: deciding those many-to-one costs precision (F1 0.965 against 0.978 one-to-one).
DUPLICATES_SHARE = 0.05
DUPLICATES_MIN = 5


def near_certain_counts(rows: IntArray, cols: IntArray, weights: FloatArray, *,
                        level: float = NEAR_CERTAIN) -> dict[str, int]:
    """How many records of each side have a near-certain counterpart (independent probability
    2^w / (1 + 2^w) ≥ ``level``) and how many have several: a secondary record with several
    near-certain primary counterparts means the primary holds duplicates of it."""
    w = np.asarray(weights, dtype=np.float64)
    sure = w >= math.log2(level / (1.0 - level))
    per_row = np.bincount(np.asarray(rows)[sure]) if sure.any() else np.zeros(0, np.int64)
    per_col = np.bincount(np.asarray(cols)[sure]) if sure.any() else np.zeros(0, np.int64)
    return {"primary_with_one": int((per_row >= 1).sum()),
            "primary_with_several": int((per_row >= 2).sum()),
            "secondary_with_one": int((per_col >= 1).sum()),
            "secondary_with_several": int((per_col >= 2).sum())}


def estimate_cardinality(rows: IntArray, cols: IntArray, weights: FloatArray
                         ) -> tuple[str, str, dict[str, int]]:
    """The cardinality the data show, why (in words), and the counts it rests on
    (:func:`near_certain_counts`, weights of a model fitted one-to-one): a side holds
    duplicates when at least :data:`DUPLICATES_SHARE` (and :data:`DUPLICATES_MIN`) of the other
    side's records with a near-certain counterpart have several. Duplicates in the primary make
    the link many-to-one, in the secondary one-to-many, in both many-to-many."""
    counts = near_certain_counts(rows, cols, weights)

    def holds(several: int, one: int) -> bool:
        return several >= DUPLICATES_MIN and several >= DUPLICATES_SHARE * max(one, 1)

    dup_p = holds(counts["secondary_with_several"], counts["secondary_with_one"])
    dup_s = holds(counts["primary_with_several"], counts["primary_with_one"])
    chosen = {(False, False): "one-to-one", (True, False): "many-to-one",
              (False, True): "one-to-many", (True, True): "many-to-many"}[(dup_p, dup_s)]
    level = f"p ≥ {NEAR_CERTAIN:g}"

    def say(several: int, one: int, side: str, other: str) -> str:
        share = several / one if one else 0.0
        return (f"{several:,} of the {one:,} {side} records with a near-certain counterpart "
                f"({level}) have several in the {other} ({share:.1%})")

    why = "; ".join([say(counts["secondary_with_several"], counts["secondary_with_one"],
                         "secondary", "primary"),
                     say(counts["primary_with_several"], counts["primary_with_one"],
                         "primary", "secondary")])
    reason = {"one-to-one": "neither table holds duplicates of the other's records",
              "many-to-one": "the primary holds duplicates (several primary records of one "
                             "secondary record)",
              "one-to-many": "the secondary holds duplicates (several secondary records of "
                             "one primary record)",
              "many-to-many": "both tables hold duplicates"}[chosen]
    return chosen, f"{reason}: {why}", counts


def _pair_weights(levels: npt.NDArray[np.int64], lam: float, m: Sequence[FloatArray],
                  u: Sequence[FloatArray]) -> FloatArray:
    """The match weight of every pair (no term frequencies): the E-step's log-odds."""
    w = np.full(len(levels), math.log2(lam / (1.0 - lam)))
    for f, (m_f, u_f) in enumerate(zip(m, u, strict=True)):
        col = levels[:, f]
        present = col >= 0
        w[present] += np.log2(np.maximum(m_f, _FLOOR) / np.maximum(u_f, _FLOOR))[col[present]]
    return w


def fit_em(levels: Int8Array, n_levels: Sequence[int], u_random: Sequence[FloatArray],
           rows: IntArray, cols: IntArray, *, total_pairs: float,
           names: Sequence[str] = (), level_names: Sequence[Sequence[str]] = (),
           lam: float | None = None, m: Sequence[FloatArray] | None = None,
           max_iter: int = 200, tol: float = 1e-7, prior_m: float = M_PRIOR_PAIRS,
           cardinality: str = "one-to-one") -> FSModel:
    """m and λ by EM under the ``cardinality``'s constraint (module docstring: the E-step is
    :func:`posterior`).

    ``levels[i]`` are the levels of candidate pair (``rows[i]``, ``cols[i]``), drawn from
    ``total_pairs`` pairs (n_P·n_S: every pair outside the candidates counts as a non-match);
    ``u_random`` the random pairs' level shares (:func:`estimate_u`), unmixed each iteration
    with the current λ and m. λ starts at ``lam`` (default: the most matches the cardinality
    allows, :func:`prior_matches` / total_pairs), m at ``m`` (default :func:`initial_m`); the
    M-step adds ``prior_m`` pseudo-pairs distributed as :func:`initial_m` (a MAP estimate
    under a Dirichlet prior), so a level seen in few matches keeps a finite weight. Stops when
    no m moves by more than ``tol`` and λ by more than ``tol`` relatively.
    """
    n_fields = len(n_levels)
    lv = np.asarray(levels, dtype=np.int8)
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    if lv.ndim != 2 or lv.shape[1] != n_fields or len(rows) != len(lv) or len(cols) != len(lv):
        raise LinkageError(f"levels must be (pairs, {n_fields}) with one row and one column "
                           f"per pair, got {lv.shape}, {len(rows)} rows, {len(cols)} columns")
    if len(lv) == 0:
        raise LinkageError("the Fellegi–Sunter model needs at least one candidate pair")
    total = float(total_pairs)
    if total < len(lv):
        raise LinkageError(f"total_pairs = {total_pairs} is below the {len(lv)} candidate "
                           "pairs")
    _check_cardinality(cardinality)
    if lam is None:
        lam = prior_matches(int(rows.max()) + 1, int(cols.max()) + 1, cardinality) / total
    lam = min(max(float(lam), _FLOOR), 0.5)
    m_cur = [np.asarray(x, dtype=np.float64).copy() for x in (m or initial_m(n_levels))]
    m_prior = [prior_m * x for x in initial_m(n_levels)]
    codes = lv.astype(np.int64)
    present = [codes[:, f] >= 0 for f in range(n_fields)]
    converged = False
    iteration = 0
    while iteration < max_iter:
        iteration += 1
        q = posterior(rows, cols,
                      _pair_weights(codes, lam, m_cur, unmix_u(u_random, lam, m_cur)),
                      cardinality)
        new_m = []
        for f, n in enumerate(n_levels):
            col, here = codes[:, f], present[f]
            mass = np.bincount(col[here], weights=q[here], minlength=n)[:n] + m_prior[f]
            s = float(mass.sum())
            new_m.append(np.maximum(mass / s, _FLOOR) if s > 0 else np.full(n, 1.0 / n))
        new_lam = min(max(float(q.sum()) / total, _FLOOR), 0.5)
        change = max([abs(new_lam / lam - 1.0)]
                     + [float(np.abs(a - b).max()) for a, b in zip(new_m, m_cur, strict=True)])
        lam, m_cur = new_lam, new_m
        if change < tol:
            converged = True
            break
    return FSModel(names=tuple(names) or tuple(f"field{f}" for f in range(n_fields)),
                   levels=tuple(tuple(x) for x in level_names) or tuple(
                       tuple(str(i) for i in range(n)) for n in n_levels),
                   m=tuple(m_cur), u=tuple(unmix_u(u_random, lam, m_cur)), lam=float(lam),
                   iterations=iteration, converged=converged,
                   extra={"u_random": tuple(np.asarray(x, dtype=np.float64) for x in u_random),
                          "cardinality": cardinality})


def fit_em_reference(levels: Int8Array, n_levels: Sequence[int],
                     u_random: Sequence[FloatArray], rows: IntArray, cols: IntArray, *,
                     total_pairs: float, lam: float, m: Sequence[FloatArray], iterations: int,
                     prior_m: float = M_PRIOR_PAIRS, cardinality: str = "one-to-one"
                     ) -> FSModel:
    """Plain reference of :func:`fit_em`: the same EM, pair by pair in Python floats (the
    posterior's row and column sums by dictionaries), for a fixed number of iterations."""
    by_rows, by_cols = _check_cardinality(cardinality)
    pairs = list(zip(np.asarray(rows).tolist(), np.asarray(cols).tolist(),
                     np.asarray(levels).tolist(), strict=True))
    ramp = [list(map(float, x)) for x in initial_m(n_levels)]
    m_cur = [list(map(float, x)) for x in m]
    for _ in range(iterations):
        u_cur = []
        for shares, m_f in zip(u_random, m_cur, strict=True):
            lam_u = min(max(lam, 0.0), 0.5)
            raw = [max((float(s) - lam_u * mf) / (1.0 - lam_u), 0.1 * float(s))
                   for s, mf in zip(shares, m_f, strict=True)]
            u_cur.append([x / sum(raw) for x in raw])
        odds = []
        for _, _, row in pairs:
            o = lam / (1.0 - lam)
            for f, level in enumerate(row):
                if level >= 0:
                    o *= max(m_cur[f][level], _FLOOR) / max(u_cur[f][level], _FLOOR)
            odds.append(o)
        by_row: dict[int, float] = {}
        by_col: dict[int, float] = {}
        for (r, c, _), o in zip(pairs, odds, strict=True):
            by_row[r] = by_row.get(r, 0.0) + o
            by_col[c] = by_col.get(c, 0.0) + o
        post = [o / (1.0 + (by_row[r] if by_rows else o) + (by_col[c] - o if by_cols else 0.0))
                for (r, c, _), o in zip(pairs, odds, strict=True)]
        new_m = []
        for f in range(len(n_levels)):
            mass = [prior_m * x for x in ramp[f]]
            for (_, _, row), p in zip(pairs, post, strict=True):
                if row[f] >= 0:
                    mass[row[f]] += p
            new_m.append([max(x / sum(mass), _FLOOR) for x in mass])
        lam = min(max(sum(post) / float(total_pairs), _FLOOR), 0.5)
        m_cur = new_m
    return FSModel(names=tuple(f"field{f}" for f in range(len(n_levels))),
                   levels=tuple(tuple(str(i) for i in range(n)) for n in n_levels),
                   m=tuple(np.asarray(x) for x in m_cur),
                   u=tuple(np.asarray(x, dtype=float) for x in u_random), lam=lam,
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
