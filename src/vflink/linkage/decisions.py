"""Decisions on scored candidate pairs, and how good they are with and without labels.

* **Threshold**: a pair is a match when its match probability is at least ``threshold``.
* **One-to-one** (each record matched at most once on each side): ``"optimal"`` maximises the
  total match weight of the kept pairs (an assignment problem, solved per connected component
  of the candidate graph with :func:`scipy.optimize.linear_sum_assignment`), ``"greedy"`` takes
  pairs by decreasing weight while both records are free (Splink's and anonlink's greedy
  solver).
* **Clusters** for more than two parties: connected components of the matched pairs over all
  parties' records (:func:`match_clusters`).

**Quality without labels.** The match probabilities are the posterior q of the trained model
under the link's cardinality (:func:`vflink.linkage.fellegi_sunter.posterior`): one-to-one, the
probability that (i, j) is the match when i and j each have at most one; many-to-one, when i
has at most one. If they are calibrated, then for a set S of chosen pairs, with M = Σ q over
all candidates the expected number of true matches,

    TP̂ = Σ_S q,  precision̂ = TP̂ / |S|,  recall̂ = TP̂ / M,  F1̂ = 2·TP̂ / (|S| + M).

Matches outside the candidates (missed by blocking) are not counted here: this recall is
relative to the candidate pairs (:mod:`vflink.linkage.diagnostics` estimates what the blocking
rules miss and checks the conditions these figures rest on). :func:`threshold_curve` gives the
estimates at every threshold.

**Clusters** of a many-to-many link (:func:`pair_clusters`): the connected components of the
pairs at or above a probability, over both tables' records (Splink's
``cluster_pairwise_predictions_at_threshold``).

**Quality with labels**: :func:`measure` (precision, recall, F1 of chosen pairs against true
pairs) and :func:`pr_curve`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError
from vflink.linkage.fellegi_sunter import _check_cardinality, one_to_one_posterior

__all__ = ["ONE_TO_ONE", "check_threshold", "decide", "estimate_quality", "greedy_one_to_one",
           "greedy_within", "match_clusters", "measure", "one_to_one_posterior",
           "optimal_one_to_one", "pair_clusters", "pr_curve", "threshold_curve"]

log = logging.getLogger(__name__)

ONE_TO_ONE = ("optimal", "greedy")
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
#: Largest component (rows × columns) solved exactly; a larger one falls back to greedy.
_DENSE_LIMIT = 4 * 10**7


def check_threshold(threshold: float) -> float:
    """``threshold`` if it is a probability in (0, 1), else a ConfigError."""
    if not isinstance(threshold, (int, float)) or not 0.0 < threshold < 1.0:
        raise ConfigError(f"`threshold` must be a probability in (0, 1), got {threshold!r}")
    return float(threshold)


def greedy_one_to_one(rows: IntArray, cols: IntArray, weights: FloatArray) -> BoolArray:
    """Pairs taken by decreasing weight while both records are free (ties: first pair)."""
    keep = np.zeros(len(rows), dtype=bool)
    if not len(rows):
        return keep
    order = np.argsort(-np.asarray(weights), kind="stable")
    used_r: set[int] = set()
    used_c: set[int] = set()
    for i, r, c in zip(order.tolist(), rows[order].tolist(), cols[order].tolist(), strict=True):
        if r in used_r or c in used_c:
            continue
        used_r.add(r)
        used_c.add(c)
        keep[i] = True
    return keep


def greedy_within(rows: IntArray, cols: IntArray, weights: FloatArray,
                  cardinality: str = "one-to-one") -> BoolArray:
    """Pairs taken by decreasing weight while the records the ``cardinality`` constrains are
    free: both (one-to-one, :func:`greedy_one_to_one`), the primary record (many-to-one), the
    secondary record (one-to-many), neither (many-to-many: every pair)."""
    by_rows, by_cols = _check_cardinality(cardinality)
    if by_rows and by_cols:
        return greedy_one_to_one(rows, cols, weights)
    keep = np.ones(len(rows), dtype=bool)
    if not (by_rows or by_cols) or not len(rows):
        return keep
    side = np.asarray(rows if by_rows else cols)
    order = np.lexsort((np.arange(len(side)), -np.asarray(weights), side))
    first = np.ones(len(order), dtype=bool)
    first[1:] = side[order][1:] != side[order][:-1]
    keep[:] = False
    keep[order[first]] = True
    return keep


def optimal_one_to_one(rows: IntArray, cols: IntArray, weights: FloatArray, *,
                       floor: float | None = None) -> BoolArray:
    """The one-to-one subset of the pairs with the largest total of ``weights − floor``
    (``floor``: just below the smallest weight, so every pair counts positively and a record
    stays unmatched only when matching it would cost more than it brings)."""
    keep = np.zeros(len(rows), dtype=bool)
    if not len(rows):
        return keep
    w = np.asarray(weights, dtype=np.float64)
    gain = w - ((float(w.min()) - 1.0) if floor is None else floor)
    ur, r_idx = np.unique(rows, return_inverse=True)
    uc, c_idx = np.unique(cols, return_inverse=True)
    n_r, n_c = len(ur), len(uc)
    from scipy import sparse  # scipy here, not at import: every link imports this module
    from scipy.sparse.csgraph import connected_components

    graph = sparse.coo_matrix((np.ones(len(rows)), (r_idx, n_r + c_idx)),
                              shape=(n_r + n_c, n_r + n_c))
    _, label = connected_components(graph, directed=False)
    comp = label[r_idx]
    order = np.argsort(comp, kind="stable")
    bounds = np.flatnonzero(np.diff(comp[order])) + 1
    for part in np.split(order, bounds):
        if len(part) == 1:
            keep[part] = True
            continue
        pr, pr_idx = np.unique(r_idx[part], return_inverse=True)
        pc, pc_idx = np.unique(c_idx[part], return_inverse=True)
        if len(pr) * len(pc) > _DENSE_LIMIT:
            log.warning("one-to-one: a component of %d × %d records is too large for the "
                        "exact assignment; greedy there", len(pr), len(pc))
            keep[part[greedy_one_to_one(rows[part], cols[part], w[part])]] = True
            continue
        matrix = np.zeros((len(pr), len(pc)))
        matrix[pr_idx, pc_idx] = gain[part]
        from scipy.optimize import linear_sum_assignment

        ar, ac = linear_sum_assignment(matrix, maximize=True)
        chosen = np.zeros((len(pr), len(pc)), dtype=bool)
        chosen[ar, ac] = True
        keep[part[chosen[pr_idx, pc_idx]]] = True
    return keep


def decide(rows: IntArray, cols: IntArray, probabilities: FloatArray, weights: FloatArray, *,
           threshold: float = 0.5, one_to_one: str | None = None) -> BoolArray:
    """The ``match`` decision of every pair: match probability ≥ ``threshold``, then, if
    asked, the one-to-one subset of those with the largest total ``weights`` (``"optimal"``)
    or taken by decreasing weight (``"greedy"``). With the one-to-one posterior as the
    probability, a threshold ≥ 1/2 already keeps at most one pair per record."""
    if one_to_one is not None and one_to_one not in ONE_TO_ONE:
        raise ConfigError(f"`one_to_one` must be one of {', '.join(ONE_TO_ONE)}, got "
                          f"{one_to_one!r}")
    check_threshold(threshold)
    above = np.asarray(probabilities, dtype=np.float64) >= threshold
    if one_to_one is None:
        return above
    w = np.asarray(weights, dtype=np.float64)
    idx = np.flatnonzero(above)
    solve = optimal_one_to_one if one_to_one == "optimal" else greedy_one_to_one
    out = np.zeros(len(w), dtype=bool)
    out[idx[solve(rows[idx], cols[idx], w[idx])]] = True
    return out


def estimate_quality(posterior: FloatArray, chosen: BoolArray) -> dict[str, float]:
    """Label-free precision, recall and F1 of the ``chosen`` pairs (module docstring), and the
    expected number of true matches among the candidates."""
    q = np.asarray(posterior, dtype=np.float64)
    expected = float(q.sum())
    n = int(np.count_nonzero(chosen))
    tp = float(q[np.asarray(chosen, dtype=bool)].sum())
    return {"expected_matches": expected, "chosen": float(n),
            "precision": tp / n if n else 1.0,
            "recall": tp / expected if expected > 0 else 1.0,
            "f1": 2.0 * tp / (n + expected) if n + expected > 0 else 1.0}


def threshold_curve(rows: IntArray, cols: IntArray, probabilities: FloatArray,
                    thresholds: Sequence[float] | None = None, *,
                    cardinality: str = "one-to-one") -> dict[str, list[float]]:
    """Estimated precision, recall and F1 of "probability ≥ t, then greedy within the
    cardinality" (:func:`greedy_within`) at each threshold t (default 0.01 … 0.99), the
    probabilities being the posterior under that cardinality (module docstring). Greedy on a
    prefix of the pairs sorted by probability is the prefix of the greedy solution, so one pass
    gives every threshold."""
    ts = np.asarray(thresholds if thresholds is not None else np.linspace(0.01, 0.99, 99))
    q = np.asarray(probabilities, dtype=np.float64)
    expected = float(q.sum())
    order = np.argsort(-q, kind="stable")
    kept = greedy_within(rows[order], cols[order], q[order], cardinality)
    sorted_q = q[order]
    n_cum = np.cumsum(kept)
    tp_cum = np.cumsum(np.where(kept, sorted_q, 0.0))
    out: dict[str, list[float]] = {"threshold": [], "precision": [], "recall": [], "f1": [],
                                   "chosen": []}
    for t in ts:
        # pairs with q ≥ t are the prefix of the descending order
        end = int(np.searchsorted(-sorted_q, -check_threshold(float(t)), side="right"))
        n = int(n_cum[end - 1]) if end else 0
        tp = float(tp_cum[end - 1]) if end else 0.0
        out["threshold"].append(float(t))
        out["chosen"].append(float(n))
        out["precision"].append(tp / n if n else 1.0)
        out["recall"].append(tp / expected if expected > 0 else 1.0)
        out["f1"].append(2.0 * tp / (n + expected) if n + expected > 0 else 1.0)
    return out


def _pair_codes(rows: npt.ArrayLike, cols: npt.ArrayLike) -> npt.NDArray[np.int64]:
    r = np.asarray(rows, dtype=np.int64)
    c = np.asarray(cols, dtype=np.int64)
    return r * (1 << 32) + c  # one code per pair for |row|, |col| < 2^31


def measure(rows: IntArray, cols: IntArray, truth_rows: npt.ArrayLike,
            truth_cols: npt.ArrayLike) -> dict[str, float]:
    """Precision, recall and F1 of the pairs (rows[i], cols[i]) against the true pairs."""
    chosen = np.unique(_pair_codes(rows, cols))
    true = np.unique(_pair_codes(truth_rows, truth_cols))
    tp = int(np.isin(chosen, true, assume_unique=True).sum())
    precision = tp / len(chosen) if len(chosen) else 1.0
    recall = tp / len(true) if len(true) else 1.0
    f1 = 2 * tp / (len(chosen) + len(true)) if len(chosen) + len(true) else 1.0
    return {"precision": precision, "recall": recall, "f1": f1, "true_positives": float(tp),
            "chosen": float(len(chosen)), "true_pairs": float(len(true))}


def pr_curve(rows: IntArray, cols: IntArray, scores: FloatArray, truth_rows: npt.ArrayLike,
             truth_cols: npt.ArrayLike, *, points: int = 101) -> dict[str, list[float]]:
    """Measured precision and recall of "score ≥ s" over the candidate pairs, at ``points``
    score quantiles (recall counts every true pair, found among the candidates or not)."""
    s = np.asarray(scores, dtype=np.float64)
    true = np.unique(_pair_codes(truth_rows, truth_cols))
    is_true = np.isin(_pair_codes(rows, cols), true)
    n_true = len(true)
    order = np.argsort(-s, kind="stable")
    ranked = s[order]
    tp = np.cumsum(is_true[order])
    cuts = np.unique(np.linspace(0, len(s), points).astype(np.int64).clip(1, max(len(s), 1)))
    out: dict[str, list[float]] = {"score": [], "precision": [], "recall": []}
    for end in cuts if len(s) else []:
        out["score"].append(float(ranked[end - 1]))
        out["precision"].append(float(tp[end - 1] / end))
        out["recall"].append(float(tp[end - 1] / n_true) if n_true else 1.0)
    return out


def match_clusters(sizes: Sequence[int], pairs: Sequence[tuple[int, int, Any, Any]]
                   ) -> list[IntArray]:
    """Cluster ids of every record of every party (records of party a are nodes
    ``offset_a + row``): connected components of the matched pairs ``(a, b, rows_a, rows_b)``
    (parties a and b, their matched rows). A record matched to nobody is its own cluster."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    src, dst = [], []
    for a, b, ra, rb in pairs:
        src.append(offsets[a] + np.asarray(ra, dtype=np.int64))
        dst.append(offsets[b] + np.asarray(rb, dtype=np.int64))
    n = int(offsets[-1])
    s = np.concatenate(src) if src else np.zeros(0, dtype=np.int64)
    d = np.concatenate(dst) if dst else np.zeros(0, dtype=np.int64)
    from scipy import sparse
    from scipy.sparse.csgraph import connected_components

    graph = sparse.coo_matrix((np.ones(len(s)), (s, d)), shape=(n, n))
    _, label = connected_components(graph, directed=False)
    return [label[offsets[i]:offsets[i + 1]].astype(np.int64) for i in range(len(sizes))]


def pair_clusters(rows: IntArray, cols: IntArray, probabilities: FloatArray, n_primary: int,
                  n_secondary: int, *, threshold: float = 0.5
                  ) -> tuple[IntArray, IntArray]:
    """Cluster ids of every primary and every secondary record: the connected components of
    the pairs whose probability is at least ``threshold`` (as Splink's
    ``cluster_pairwise_predictions_at_threshold``); a record in no such pair is its own
    cluster. Ids are numbered from 0 in order of each cluster's first primary, then secondary,
    record."""
    check_threshold(threshold)
    keep = np.asarray(probabilities, dtype=np.float64) >= threshold
    labels = match_clusters([n_primary, n_secondary],
                            [(0, 1, np.asarray(rows)[keep], np.asarray(cols)[keep])])
    both = np.concatenate(labels)
    _, first, inverse = np.unique(both, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    ids = rank[inverse.ravel()]
    return ids[:n_primary], ids[n_primary:]
